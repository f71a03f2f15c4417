"""The test process's Spark: one JVM, and in it one SparkContext at a time (PySpark allows no more).

Most Spark tests share a local session (`local[2]`); the standalone cluster's tests
(test_cluster.py) use an application on the cluster for their checks and for reading what the
jobs wrote. Whichever is asked for while the other runs, the other is stopped first and the new
one starts in the same JVM (a SparkContext, seconds; not a JVM). Under `make test` the two live in
different worker processes (tests/conftest.py groups them) and no switch happens; one process
running both (`pytest tests/spark`, `-p no:xdist`) switches once or twice.

The JVM is started once by relay.spark.session (connector jars, scratch folder) with
JAVA_TOOL_OPTIONS (tests/spark/cluster.py: C1 only, serial GC), which it inherits.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.spark.cluster import JAVA_TOOL_OPTIONS

LOCAL = "local[2]"
# The cluster application leaves the worker's other cores and memory to the jobs the tests run
# as commands (tests/spark/cluster.py sizes the worker for both).
CLUSTER_APP_CONF = {"spark.cores.max": "1", "spark.executor.memory": "512m"}

_running: list[Any] = []  # the SparkSession this process runs now (at most one)


def _start(master: str, conf: dict[str, str]) -> Any:
    from relay.spark.session import spark_session

    stop()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAVA_TOOL_OPTIONS", JAVA_TOOL_OPTIONS)
        session = spark_session("outbox-relay tests", master=master, shuffle_partitions=2,
                                conf={"spark.ui.enabled": "false", **conf})
    _running.append(session)
    return session


def _current(master: str) -> Any:
    return next((s for s in _running if s.sparkContext.master == master), None)


def local_session() -> Any:
    """The shared local session: the running one, else a new one."""
    return _current(LOCAL) or _start(LOCAL, {})


def cluster_session(master_url: str) -> Any:
    """An application on the standalone cluster at `master_url`: the running one, else a new one
    (one core, a 512 MB executor)."""
    return _current(master_url) or _start(master_url, CLUSTER_APP_CONF)


def stop() -> None:
    """Stop the running session, if any (the JVM stays for the next)."""
    while _running:
        _running.pop().stop()

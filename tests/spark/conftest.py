"""Spark fixtures: one SparkSession (local[2]) for the whole test session.

The session runs in this process with the connector jars from the Maven cache
(`relay.spark.jars`), two shuffle partitions, no UI, and its scratch space in a fresh
temporary folder. The servers are the session's real MongoDB and Kafka (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.cluster import JAVA_TOOL_OPTIONS


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from relay.spark.session import spark_session

    # The session's JVM compiles with C1 only, as the cluster's do (tests/spark/cluster.py says
    # why; measured here: 10 Spark tests 75 -> 64 s); it inherits the variable when it starts.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAVA_TOOL_OPTIONS", JAVA_TOOL_OPTIONS)
        session = spark_session("outbox-relay tests", master="local[2]", shuffle_partitions=2,
                                conf={"spark.ui.enabled": "false"})
    try:
        yield session
    finally:
        session.stop()

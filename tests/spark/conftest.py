"""Spark tests: the SparkSession is the session-wide `spark` fixture (tests/conftest.py), shared
with tests/interop/test_spark_from_avro.py; the servers are the session's real MongoDB and Kafka.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """A job's `main()` run in the test's process (materialize) sets SIGTERM and SIGINT handlers that
    only set its stop flag: left behind, Ctrl-C would no longer interrupt the run."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)

"""The servers the tests run against: their addresses (`Servers`, the `servers` fixture), their
processes for a test that kills or pauses them (`needs_local_stack`), and a mongod replica set
of a test's own (`replica_set`)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.topics import release_kafka_clients


@dataclass
class Servers:
    mongodb_uri: str
    kafka_bootstrap: str
    stack: Any  # relay.dev.stack.LocalStack when the tests started the servers themselves


def needs_local_stack(servers: Servers) -> Any:
    """The servers' processes, for a test that kills or pauses them (earlier tests' Kafka clients
    freed first: release_kafka_clients)."""
    import pytest

    if servers.stack is None:
        pytest.skip("kills or pauses servers: needs the servers started by the tests themselves")
    release_kafka_clients()
    return servers.stack


@contextlib.contextmanager
def replica_set(prefix: str, **kwargs: Any) -> Iterator[Any]:
    """A mongod replica set of its own in a fresh folder, stopped by pid and removed after."""
    from relay.dev.stack import MongoReplicaSet

    rs = MongoReplicaSet(Path(tempfile.mkdtemp(prefix=prefix)), **kwargs)
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()
        shutil.rmtree(rs.base_dir, ignore_errors=True)

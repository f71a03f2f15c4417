"""The servers the tests run against: their addresses (`Servers`, the `servers` fixture), their
processes for a test that kills or pauses them (`needs_local_stack`), a mongod replica set of a
test's own (`replica_set`), and the session's servers started on demand (`OnDemand`)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from tests.support.topics import release_kafka_clients

T = TypeVar("T")


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


def one_line(error: BaseException) -> str:
    """An error as one line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else '(no message)'}"


class OnDemand(Generic[T]):
    """A server the session's tests share (one per pytest-xdist worker), started by the first test
    that needs it and stopped by `close()` at the session's end.

    A start that fails fails the test that asked with one line (the server's own: relay.dev
    errors name the port or the log), and the next test that asks tries again; once `tries`
    starts have failed, every later test fails at once with that line and no new start. A session
    fixture that raised would have its error cached and served by pytest to every later test of
    the worker (148 errors for one taken port, issue 50): here a fixture of the test's own scope
    asks `get()`, so nothing is cached but the server."""

    def __init__(self, name: str, start: Callable[[], contextlib.AbstractContextManager[T]], tries: int = 2) -> None:
        self.name = name
        self._start = start
        self._tries = tries
        self._running: contextlib.ExitStack | None = None
        self._value: T | None = None
        self.failures: list[str] = []

    def get(self) -> T:
        import pytest

        if self._running is not None:
            return self._value  # type: ignore[return-value]
        if len(self.failures) >= self._tries:
            pytest.fail(f"{self.name} not started: {self.failures[-1]} (not tried again: {len(self.failures)} "
                        f"starts failed on this worker)", pytrace=False)
        running = contextlib.ExitStack()
        try:
            self._value = running.enter_context(self._start())
        except Exception as exc:  # noqa: BLE001 - every failed start is the test's one line
            running.close()
            self.failures.append(one_line(exc))
            pytest.fail(f"{self.name} did not start: {self.failures[-1]}", pytrace=False)
        self._running = running
        return self._value

    def close(self) -> None:
        if self._running is not None:
            self._running.close()
        self._running, self._value = None, None

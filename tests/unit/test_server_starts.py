"""tests/support/servers.py OnDemand: a session's server that cannot start fails the tests that
asked with one line, is tried again by the next test, and after two failed starts fails later
tests at once, without a third start (no error cached for every test of a worker)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from relay.dev.errors import PortTakenError
from tests.support.servers import OnDemand


def test_a_start_that_fails_fails_its_test_in_one_line_and_the_next_test_tries_again():
    starts: list[str] = []
    stopped: list[str] = []

    @contextlib.contextmanager
    def start() -> Iterator[str]:
        starts.append("start")
        if len(starts) == 1:
            raise PortTakenError("Kafka broker on port 20001", 20002, None, " (the last of 3 starts)")
        try:
            yield "servers"
        finally:
            stopped.append("stop")

    servers = OnDemand("MongoDB and Kafka", start)
    with pytest.raises(pytest.fail.Exception) as failed:
        servers.get()
    assert str(failed.value) == ("MongoDB and Kafka did not start: PortTakenError: Kafka broker on port 20001 could "
                                 "not start: port 20002 is taken by another process (the last of 3 starts)")
    assert failed.value.pytrace is False, "one line, no traceback"
    assert servers.get() == "servers" and servers.get() == "servers"
    assert len(starts) == 2, "started again once, then kept"
    servers.close()
    assert stopped == ["stop"]


def test_after_two_failed_starts_later_tests_fail_at_once_with_the_line():
    starts: list[str] = []

    @contextlib.contextmanager
    def start() -> Iterator[str]:
        starts.append("start")
        raise RuntimeError("Java 17 or newer is needed\n(a second line nobody needs)")
        yield "never"

    servers = OnDemand("MongoDB and Kafka", start)
    for _ in range(2):
        with pytest.raises(pytest.fail.Exception, match="did not start: RuntimeError: Java 17 or newer is needed$"):
            servers.get()
    for _ in range(5):
        with pytest.raises(pytest.fail.Exception) as failed:
            servers.get()
    assert len(starts) == 2, "no third start"
    assert str(failed.value) == ("MongoDB and Kafka not started: RuntimeError: Java 17 or newer is needed "
                                 "(not tried again: 2 starts failed on this worker)")

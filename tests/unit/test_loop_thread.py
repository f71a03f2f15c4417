"""relay.loop_thread.EventLoopThread's `run` and the JetStream inbox's polls on it: a coroutine's
own TimeoutError is its own, not the wait's; a fetch that nats-py ends with asyncio's TimeoutError
(its wait all but over) is an empty poll, not the end of the inbox."""

from __future__ import annotations

import asyncio
import threading

import pytest

from relay.inbox.batching import BatchLimits
from relay.inbox.config import RunOptions
from relay.inbox.jetstream import JetStreamSource
from relay.loop_thread import EventLoopThread


def test_a_coroutines_own_timeout_is_raised_as_it_is_and_a_slow_one_is_named():
    thread = EventLoopThread("test-loop")

    async def gives_up() -> None:
        raise TimeoutError("the server's own words")

    async def slow() -> None:
        await asyncio.sleep(10)

    try:
        with pytest.raises(TimeoutError, match="the server's own words"):
            thread.run(gives_up(), 5)
        with pytest.raises(TimeoutError, match="slow: no answer within 0.1 s"):
            thread.run(slow(), 0.1)
    finally:
        thread.close()


def test_a_jetstream_fetch_ended_by_asyncios_timeout_is_an_empty_poll():
    class Subscription:
        async def fetch(self, batch: int, timeout: float) -> list[object]:
            raise TimeoutError  # asyncio.TimeoutError: nats-py 2.16 when the deadline is all but spent

    source = JetStreamSource.__new__(JetStreamSource)  # no server: only the gathering is under test
    source._options = RunOptions.of(["outbox.>"], "g", None, {"nats_servers": "nats://127.0.0.1:4222"})
    source._delivered, source._sub = {}, Subscription()
    assert asyncio.run(source._gather(BatchLimits(10, 0.05), threading.Event())) == []

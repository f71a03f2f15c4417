"""What the benchmark reads from NATS JetStream: the counterpart of bench.common's Kafka helpers.

Every NATS contestant publishes into a stream of its own, created by the harness before it starts
as an operator would (`create_stream`: file storage, the contestant's subjects, the relay's
default duplicate window of 120 s), so that nobody's time includes creating it and every stream
is configured alike. JetStream stamps every message with the server's time when it stored it (the
host's wall clock, as Kafka's LogAppendTime is): a catch-up is timed from the stream's first
stored message to its last (`Streams.span`, read with the `$JS.API.STREAM.MSG.GET` of each end),
a latency from an event's commit to its message's stored time (`Streams.arrivals`, from the
metadata of a consumer's deliveries, which carries that stored time).

`Streams` holds one connection on an event loop thread of its own (relay.loop_thread) for
the harness's questions; `LiveStream` is a live reader (an ordered push consumer), the NATS
counterpart of the Kafka steady-state rounds' live read_committed consumer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from bench.scenarios.drain import Span
from relay.loop_thread import EventLoopThread

MSG_ID = "Nats-Msg-Id"
DUPLICATE_WINDOW_S = 120.0  # the relay's default (RELAY_NATS_DUPLICATE_WINDOW_S)
_TIMEOUT_S = 30.0
_FETCH = 1000


def stream_name(*parts: str) -> str:
    """A JetStream stream name from `parts` (no `.`, `*`, `>`, white space or path separators)."""
    name = "_".join(parts)
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:200]


async def _connect(url: str) -> Any:
    return await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=5)


class Streams:
    """The harness's connection to JetStream (one connection, its own event loop thread); close it
    (or use it as a context manager)."""

    def __init__(self, url: str) -> None:
        self._thread = EventLoopThread("bench-jetstream")
        try:
            self._nc = self._thread.run(_connect(url), _TIMEOUT_S)
        except BaseException:
            self._thread.close()
            raise
        self._js = self._nc.jetstream()

    def _run(self, coroutine: Any, timeout: float = _TIMEOUT_S) -> Any:
        return self._thread.run(coroutine, timeout)

    def create_stream(self, name: str, subjects: list[str], duplicate_window_s: float = DUPLICATE_WINDOW_S) -> None:
        """A stream as an operator makes one: file storage, `subjects`, the duplicate window."""
        config = StreamConfig(name=name, subjects=subjects, storage=StorageType.FILE,
                              duplicate_window=duplicate_window_s)
        self._run(self._js.add_stream(config))

    def delete_stream(self, name: str) -> None:
        """Delete the stream (and its stored messages) if it exists."""
        async def delete() -> None:
            try:
                await self._js.delete_stream(name)
            except NotFoundError:
                pass
        self._run(delete())

    def count(self, name: str) -> int:
        """Messages stored in the stream now (0 while it does not exist)."""
        async def ask() -> int:
            try:
                return int((await self._js.stream_info(name)).state.messages)
            except NotFoundError:
                return 0
        return int(self._run(ask()))

    def span(self, name: str, launched: float) -> Span:
        """The stream's first stored message to its last, by the server's stored times (Unix
        seconds, the host's clock); `launched` the contestant's launch on the same clock."""
        async def ends() -> tuple[float, float]:
            state = (await self._js.stream_info(name)).state
            if state.messages == 0:
                raise ValueError(f"stream {name} holds no message")
            first = await self._js.get_msg(name, state.first_seq)
            last = await self._js.get_msg(name, state.last_seq)
            return first.time.timestamp(), last.time.timestamp()
        first, last = self._run(ends())
        return Span(launched, first, last)

    def arrivals(self, name: str, expected: int, timeout_s: float = 120.0) -> list[tuple[str, float]]:
        """(event id, stored time in ms) of every message of the stream, in stream order, once at
        least `expected` are stored (the event id: the message's Nats-Msg-Id header)."""
        deadline = time.monotonic() + timeout_s
        while self.count(name) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expected} messages in stream {name}: only {self.count(name)} after "
                                   f"{timeout_s:.0f}s")
            time.sleep(0.05)

        async def read() -> list[tuple[str, float]]:
            last = (await self._js.stream_info(name)).state.last_seq
            sub = await self._js.pull_subscribe(
                ">", stream=name, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL,
                                                        ack_policy=AckPolicy.NONE, inactive_threshold=30))
            out: list[tuple[str, float]] = []
            try:
                seq = 0
                while seq < last:
                    for msg in await sub.fetch(_FETCH, timeout=timeout_s):
                        seq = msg.metadata.sequence.stream
                        out.append(((msg.headers or {}).get(MSG_ID, ""), msg.metadata.timestamp.timestamp() * 1000))
            finally:
                await sub.unsubscribe()
            return out
        return list(self._run(read(), timeout_s + _TIMEOUT_S))

    def close(self) -> None:
        try:
            self._run(self._nc.close(), 10)
        finally:
            self._thread.close()

    def __enter__(self) -> Streams:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fresh_stream(url: str, name: str, subjects: list[str]) -> None:
    """Stream `name` on `subjects`, empty (an earlier one of that name deleted first)."""
    with Streams(url) as streams:
        streams.delete_stream(name)
        streams.create_stream(name, subjects)


class LiveStream:
    """A live reader of a stream (an ordered push consumer from its first message), on a thread of
    its own: when each event id (Nats-Msg-Id) first arrived, by this host's clock."""

    def __init__(self, url: str, stream: str) -> None:
        self.first_seen: dict[str, float] = {}
        self._thread = EventLoopThread("bench-live-stream")

        async def on_message(msg: Any) -> None:
            self.first_seen.setdefault((msg.headers or {}).get(MSG_ID, ""), time.time())

        async def subscribe() -> tuple[Any, Any]:
            nc = await _connect(url)
            sub = await nc.jetstream().subscribe(">", stream=stream, cb=on_message, ordered_consumer=True,
                                                 deliver_policy=DeliverPolicy.ALL)
            return nc, sub

        try:
            self._nc, self._sub = self._thread.run(subscribe(), _TIMEOUT_S)
        except BaseException:
            self._thread.close()
            raise

    def stop(self) -> dict[str, float]:
        async def close() -> None:
            try:
                await self._sub.unsubscribe()
            finally:
                await self._nc.close()
        try:
            self._thread.run(close(), 10)
        finally:
            self._thread.close()
        return self.first_seen


class StreamOutput:
    """A NATS contestant's output (bench.scenarios.drain.Output): a stream of its own on `subjects`,
    created before it starts (`prepare`), counted and timed while `opened()`, deleted once measured
    (`discard`: its stored messages would fill the disk over many rounds)."""

    def __init__(self, url: str, stream: str, subjects: list[str]) -> None:
        self.url, self.stream, self.subjects = url, stream, subjects
        self._streams: Streams | None = None

    def prepare(self) -> None:
        fresh_stream(self.url, self.stream, self.subjects)

    def discard(self) -> None:
        with Streams(self.url) as streams:
            streams.delete_stream(self.stream)

    @contextmanager
    def opened(self) -> Iterator[StreamOutput]:
        with Streams(self.url) as streams:
            self._streams = streams
            try:
                yield self
            finally:
                self._streams = None

    def _open(self) -> Streams:
        if self._streams is None:
            raise RuntimeError("StreamOutput used outside opened()")
        return self._streams

    def delivered(self) -> int:
        return self._open().count(self.stream)

    def count(self) -> int:
        """Messages stored (the server dropped any copy within its duplicate window)."""
        return self._open().count(self.stream)

    def span(self, launched: float) -> Span:
        return self._open().span(self.stream, launched)



class StreamSink:
    """A steady-state contender's stream as its Sink (bench.scenarios.latency.Sink): created before
    it starts, counted while it runs, watched by a LiveStream, read back as (Nats-Msg-Id, stored
    time in ms)."""

    def __init__(self, url: str, stream: str, subjects: list[str]) -> None:
        self.url, self.stream, self.subjects = url, stream, subjects

    def prepare(self) -> None:
        fresh_stream(self.url, self.stream, self.subjects)

    @contextmanager
    def counting(self) -> Iterator[Callable[[], int]]:
        with Streams(self.url) as streams:
            yield lambda: streams.count(self.stream)

    def live(self) -> LiveStream:
        return LiveStream(self.url, self.stream)

    def arrivals(self, expected: int) -> list[tuple[str, float]]:
        with Streams(self.url) as streams:
            return streams.arrivals(self.stream, expected)

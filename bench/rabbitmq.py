"""What the benchmark reads from RabbitMQ: the counterpart of bench.jetstream for issue 53.

Every RabbitMQ contestant publishes to an exchange of its own (a durable topic exchange), into a
quorum queue of its own bound to it with `#`, both made by the harness before it starts as an
operator would (`fresh`), so that nobody's time includes declaring them and every queue is
configured alike; both are deleted once measured.

RabbitMQ 3.10 stamps no stored time on a message (the relay's `timestamp` property has whole
seconds; 3.12's `message_interceptors` that set one are newer than the server here), so:
- a catch-up (`QueueOutput`) is timed by the queue's depth: a thread asks for it (a passive
  declare, nothing consumed) every POLL_S; the first message arrived between the last poll that saw
  none and the first that saw one, the last between the poll before the final count and the one
  that saw it: each end is the middle of its interval (within POLL_S / 2);
- a steady-state round (`QueueSink`) is timed by a live consumer of the queue (auto-ack, on a
  thread of its own): an event's arrival is when that consumer received it, on this host's clock.
  That is both the latency and the "visible" figure on RabbitMQ (a delivery to a consumer follows
  the quorum queue's commit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pika
from pika.exceptions import ChannelClosedByBroker

from bench.scenarios.drain import Span

POLL_S = 0.02
_TIMEOUT_S = 120.0
QUEUE_ARGUMENTS = {"x-queue-type": "quorum"}


def amqp_name(*parts: str) -> str:
    """An exchange or queue name from `parts` (letters, digits, `-_.:`, at most 255 characters)."""
    name = ".".join(parts)
    return "".join(c if c.isalnum() or c in "-_.:" else "_" for c in name)[:255]


def _connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def fresh(url: str, exchange: str, queue: str) -> None:
    """Exchange `exchange` (durable, topic) and quorum queue `queue` bound to it with `#`, both
    empty (earlier ones of those names deleted first)."""
    connection = _connect(url)
    try:
        channel = connection.channel()
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_declare(queue, durable=True, arguments=QUEUE_ARGUMENTS)
        channel.queue_bind(queue, exchange, "#")
    finally:
        connection.close()


def discard(url: str, exchange: str, queue: str) -> None:
    """Delete the queue (its messages would fill the disk over many rounds) and the exchange."""
    connection = _connect(url)
    try:
        channel = connection.channel()
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
    finally:
        connection.close()


def depth(channel: Any, queue: str) -> int:
    """Messages ready in `queue` (a passive declare: nothing consumed); 0 while it does not exist."""
    try:
        return int(channel.queue_declare(queue, passive=True).method.message_count)
    except ChannelClosedByBroker:
        return 0


def span_of_changes(changes: list[tuple[float, int]], final: int, launched: float, queue: str = "") -> Span:
    """From a queue's depth changes (when, depth): the first message arrived when the depth first
    left 0, the last when it first reached `final`."""
    if final <= 0 or not changes:
        raise ValueError(f"queue {queue} holds no message")
    first = next(t for t, n in changes if n > 0)
    last = next(t for t, n in changes if n >= final)
    return Span(launched, first, last)


class DepthWatch:
    """A thread asking for a queue's depth every POLL_S on a connection of its own: the depth now,
    and when it changed (the middle of the interval between the poll before and the one that saw it)."""

    def __init__(self, url: str, queue: str) -> None:
        self.count = 0
        self.polls = 0
        self.changes: list[tuple[float, int]] = []  # (when, depth), each time it changed
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._url, self._queue = url, queue
        self._thread = threading.Thread(target=self._run, name="bench-queue-depth", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            connection = _connect(self._url)
        except BaseException as exc:  # noqa: BLE001 - reported by the next question
            self._error = exc
            return
        try:
            channel = connection.channel()
            before = time.time()
            while not self._stop.is_set():
                now_depth = int(channel.queue_declare(self._queue, passive=True).method.message_count)
                now = time.time()
                if now_depth != self.count:
                    self.changes.append(((before + now) / 2, now_depth))
                    self.count = now_depth
                self.polls += 1
                before = now
                self._stop.wait(POLL_S)
        except BaseException as exc:  # noqa: BLE001 - reported by the next question
            self._error = exc
        finally:
            if connection.is_open:
                connection.close()

    def settled(self) -> int:
        """The depth after the next two polls (so it is no older than the question)."""
        target = self.polls + 2
        deadline = time.monotonic() + _TIMEOUT_S
        while self.polls < target and self._error is None and self._thread.is_alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no depth of queue {self._queue} within {_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S / 2)
        if self._error is not None:
            raise RuntimeError(f"watching queue {self._queue}: {self._error}") from self._error
        return self.count

    def span(self, launched: float) -> Span:
        """The first message's arrival to the last's, by the depth's changes."""
        return span_of_changes(self.changes, self.settled(), launched, self._queue)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class QueueOutput:
    """A RabbitMQ contestant's output (bench.scenarios.drain.Output): its exchange and queue, made
    before it starts (`prepare`), counted and timed by the queue's depth while `opened()`, deleted
    once measured (`discard`)."""

    def __init__(self, url: str, exchange: str, queue: str) -> None:
        self.url, self.exchange, self.queue = url, exchange, queue
        self._watch: DepthWatch | None = None

    def prepare(self) -> None:
        fresh(self.url, self.exchange, self.queue)

    def discard(self) -> None:
        discard(self.url, self.exchange, self.queue)

    @contextmanager
    def opened(self) -> Iterator[QueueOutput]:
        self._watch = DepthWatch(self.url, self.queue)
        try:
            yield self
        finally:
            self._watch.stop()
            self._watch = None

    def _open(self) -> DepthWatch:
        if self._watch is None:
            raise RuntimeError("QueueOutput used outside opened()")
        return self._watch

    def delivered(self) -> int:
        return self._open().count

    def count(self) -> int:
        """Messages in the queue (duplicates too: RabbitMQ drops none)."""
        return self._open().settled()

    def span(self, launched: float) -> Span:
        return self._open().span(launched)


class LiveQueue:
    """A live consumer of a queue (auto-ack) on a thread of its own: each message's event id
    (`message_id`) and when it arrived (ms, this host's clock), in arrival order."""

    def __init__(self, url: str, queue: str) -> None:
        self.arrivals: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._url, self._queue = url, queue
        self._thread = threading.Thread(target=self._run, name="bench-live-queue", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            self._stop.set()
            raise RuntimeError(f"no consumer of queue {queue}: {self._error}")

    def _run(self) -> None:
        def arrived(_ch: Any, _method: Any, properties: Any, _body: bytes) -> None:
            self.arrivals.append((properties.message_id or "", time.time() * 1000))

        try:
            connection = _connect(self._url)
            channel = connection.channel()
            channel.basic_consume(self._queue, arrived, auto_ack=True)
        except BaseException as exc:  # noqa: BLE001 - raised by __init__
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                connection.process_data_events(time_limit=0.05)
        finally:
            if connection.is_open:
                connection.close()

    def stop(self) -> dict[str, float]:
        """Stop consuming; {event id: first arrival (s)}."""
        self._stop.set()
        self._thread.join(10)
        first: dict[str, float] = {}
        for event_id, at_ms in self.arrivals:
            first.setdefault(event_id, at_ms / 1000)
        return first


class QueueSink:
    """A steady-state contender's queue as its Sink (bench.scenarios.latency.Sink): made before it
    starts, consumed by a LiveQueue from the start, counted and read back from what it received."""

    def __init__(self, url: str, exchange: str, queue: str) -> None:
        self.url, self.exchange, self.queue = url, exchange, queue
        self._live: LiveQueue | None = None

    def prepare(self) -> None:
        fresh(self.url, self.exchange, self.queue)

    def live(self) -> LiveQueue:
        self._live = LiveQueue(self.url, self.queue)
        return self._live

    @contextmanager
    def counting(self) -> Iterator[Callable[[], int]]:
        live = self._live or self.live()
        yield lambda: len(live.arrivals)

    def arrivals(self, expected: int) -> list[tuple[str, float]]:
        """(event id, arrival ms) of every message the live consumer received (at least
        `expected`, which the round waited for), in arrival order; then the queue is deleted."""
        live = self._live
        if live is None or len(live.arrivals) < expected:
            raise RuntimeError(f"queue {self.queue}: {0 if live is None else len(live.arrivals)} of {expected} "
                               "messages received")
        try:
            return list(live.arrivals)
        finally:
            discard(self.url, self.exchange, self.queue)

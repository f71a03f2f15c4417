"""Where a catch-up's time goes: the relay's loop thread and its change-stream reads, side by side.

`Timeline` is switched on around one in-process catch-up (`bench.profile --where`). It times the
relay's public methods (wrapped on their classes, in this process only) and pymongo's command
monitoring: the loop's calls (the change source's `next_batch`, which waits when the
read-ahead is not back yet; the message builder's `build_many`; the publisher's `send`, and
`drain`/`poll`, the wait for acknowledgements; the lease store's `store_checkpoint`, the fenced
majority write), and every `getMore` the process sends (pymongo's command monitoring). The report
gives each as a share of the catch-up's wall time, and how much of it a getMore was in flight
(mongod reading for the relay): the read is the limit when that share is near 1 and the loop
waits for reads; when it is lower, the loop's own work (or the wait for Kafka) left mongod idle.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from pymongo import monitoring

from relay.avro.encoding import MessageBuilder
from relay.kafka.producer import IdempotentPublisher
from relay.kafka.transactions import TransactionalPublisher
from relay.mongo.lease import LeaseStore
from relay.mongo.subscription import Subscription

LOOP_PARTS = {  # what each timed call is, in the report
    "next_batch": "waiting for a read (the read-ahead not back yet) and reading its changes",
    "build_many": "encoding",
    "send": "handing messages to librdkafka (exactly-once: also ending a finished commit)",
    "wait": "waiting for Kafka's acknowledgements (drain, poll; exactly-once: for commits)",
    "store_checkpoint": "storing the checkpoint (fenced majority write)",
}

HOOKS = [(Subscription, "next_batch", "next_batch"), (MessageBuilder, "build_many", "build_many"),
         (IdempotentPublisher, "send", "send"), (IdempotentPublisher, "drain", "wait"),
         (IdempotentPublisher, "poll", "wait"), (TransactionalPublisher, "send", "send"),
         (TransactionalPublisher, "drain", "wait"), (TransactionalPublisher, "poll", "wait"),
         (LeaseStore, "store_checkpoint", "store_checkpoint")]


class _Reads(monitoring.CommandListener):
    """The getMore commands' (start, end) times, monotonic."""

    def __init__(self) -> None:
        self._begun: dict[int, float] = {}
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "getMore":
            with self._lock:
                self._begun[event.request_id] = time.monotonic()

    def _ended(self, event: Any) -> None:
        with self._lock:
            begun = self._begun.pop(event.request_id, None)
            if begun is not None:
                self.spans.append((begun, time.monotonic()))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._ended(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._ended(event)


class Timeline:
    """Loop-thread seconds per part, and the getMores in flight (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.reads = _Reads()
        self._active = False
        self._first = self._last = 0.0  # the first loop call timed, the end of the last one
        monitoring.register(self.reads)  # clients built from now on report their commands

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                if self._active:
                    self._last = time.monotonic()
                    self._first = self._first or started
                    self.seconds[part] += self._last - started
                    self.calls[part] += 1
        return timed

    @contextmanager
    def hooked(self) -> Iterator[None]:
        """The classes' methods timed while inside (this process's relays only)."""
        with ExitStack() as undo:
            for cls, name, part in HOOKS:
                original = getattr(cls, name)
                setattr(cls, name, self._timed(part, original))
                undo.callback(setattr, cls, name, original)
            yield

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record the loop's calls and the reads inside (from the first loop call to the end of the last)."""
        self.seconds.clear()
        self.calls.clear()
        self.reads.spans.clear()
        self._first = self._last = 0.0
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def format(self) -> list[str]:
        wall = self._last - self._first
        if wall <= 0:
            return ["(no loop call recorded)"]
        reads = [(max(a, self._first), min(b, self._last)) for a, b in self.reads.spans
                 if b > self._first and a < self._last]
        in_flight = sum(b - a for a, b in _union(reads))
        lines = [f"where the catch-up's {wall:.2f} s went (the loop thread; shares of that time)"]
        for part, meaning in LOOP_PARTS.items():
            lines.append(f"  {part:<17} {self.seconds[part]:7.2f} s {self.seconds[part] / wall:6.1%} "
                         f"{self.calls[part]:>6} calls  {meaning}")
        rest = wall - sum(self.seconds[p] for p in LOOP_PARTS)
        lines.append(f"  {'the rest':<17} {rest:7.2f} s {rest / wall:6.1%}         the loop's own Python between "
                     "them (and its waits for the interpreter)")
        lines.append(f"  a getMore in flight {in_flight:.2f} s, {in_flight / wall:.1%} of the time ({len(reads)} "
                     f"getMores, {in_flight / max(1, len(reads)) * 1000:.1f} ms each): mongod idle for the relay "
                     f"{1 - in_flight / wall:.1%}")
        return lines


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out

"""How every catch-up contestant is timed: from its first delivered event to its last one, on one
clock and by one rule, with its start-up reported apart.

Every contestant runs in a process of its own (the relay as `outbox-relay run`, the bare relay and
the bare change stream as `python -m bench.scenarios.<module>` children, each peer in its JVM or Go
binary). A contestant that writes to Kafka is timed from its topic: every benchmark topic carries
the broker's append time (`message.timestamp.type=LogAppendTime`, bench.common.create_topic), so
the span runs from the earliest first message of any partition to the latest last one (per
partition the append times only grow). The bare change stream, which writes nothing, reports the
wall times of its first and last change itself. Both are the host's wall clock (`time.time()`
and the broker's clock on the same machine, milliseconds). Start-up (launch to first event:
interpreter or JVM, connections, lease, stream open) is reported apart and never counted in a rate;
so is its CPU (`CpuAtFirst`): CPU per event counts the contestant's process from its first event on.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, TopicPartition

from bench.common import committed_messages, consumer, create_topic, in_kafka
from harness import ROOT
from harness.relays import ChildProcess

TAIL = 64  # offsets read back from each partition's end: past any commit markers of exactly-once


@dataclass(frozen=True)
class Span:
    """One drain on the wall clock: launched (process start), first and last event delivered."""

    launched: float
    first: float
    last: float

    @property
    def drain_s(self) -> float:
        """First delivered event to the last: what a rate divides by."""
        return self.last - self.first

    @property
    def start_up_s(self) -> float:
        """Launch to the first delivered event (reported apart)."""
        return self.first - self.launched


class CpuAtFirst:
    """The contestant process's CPU seconds (children included) when its first event was
    delivered: `poll()` it with the wait (every POLL_S); `count()` says how many were delivered."""

    def __init__(self, pid: Callable[[], int | None], count: Callable[[], int]) -> None:
        self._pid, self._count = pid, count
        self.cpu_s: float | None = None

    def poll(self) -> None:
        if self.cpu_s is None and self._count() > 0:
            self.cpu_s = process_cpu_s(self._pid())

    def per_event_us(self, cpu_s_at_end: float, events: int) -> float:
        """CPU per event from the first event to the end (NaN when the first was never seen)."""
        return (cpu_s_at_end - self.cpu_s) / events * 1e6 if self.cpu_s is not None and events else math.nan


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process and its children so far (NaN if it is gone)."""
    try:
        root = psutil.Process(pid)
        return sum(t.user + t.system for t in (p.cpu_times() for p in [root, *root.children(recursive=True)]))
    except (psutil.Error, ValueError, TypeError):
        return math.nan


def span_of(launched: float, ends: dict[int, tuple[float, float]]) -> Span:
    """The span of a topic from each partition's (first, last) append time: the earliest first
    to the latest last (partitions without messages are left out of `ends`)."""
    if not ends:
        raise ValueError("no partition holds a message")
    return Span(launched, min(first for first, _ in ends.values()), max(last for _, last in ends.values()))


def topic_span(bootstrap: str, topic: str, launched: float, isolation: str = "read_committed") -> Span:
    """`span_of` the topic's messages as a `isolation` consumer reads them (read_committed: an
    exactly-once contestant's committed messages only)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-span-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        ends: dict[int, tuple[float, float]] = {}
        for p in sorted(meta.partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                first = _append_times(c, topic, p, low, first_only=True)
                last = _append_times(c, topic, p, max(low, high - TAIL), first_only=False)
                if first and last:
                    ends[p] = (first[0], max(last))
        return span_of(launched, ends)
    finally:
        c.close()


def _append_times(c: Consumer, topic: str, partition: int, offset: int, first_only: bool) -> list[float]:
    """Append times (s) of the messages from `offset` to the partition's end (or of the first one)."""
    c.assign([TopicPartition(topic, partition, offset)])
    out: list[float] = []
    for _ in range(200):
        msg: Any = c.poll(1.0)
        if msg is None:
            continue
        if msg.error() is not None:
            if msg.error().code() == KafkaError._PARTITION_EOF:
                break
            continue
        kind, ms = msg.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError(f"{topic} does not carry the broker's append time (timestamp type {kind})")
        out.append(ms / 1000)
        if first_only:
            break
    return out


class Output(Protocol):
    """Where a catch-up contestant's messages land, and how they are counted and timed: a Kafka
    topic (`TopicOutput`) or a JetStream stream (bench.jetstream.StreamOutput)."""

    def prepare(self) -> None: ...                      # before the contestant starts (not timed)
    def opened(self) -> AbstractContextManager[Any]: ...  # the methods below work inside it
    def delivered(self) -> int: ...                     # messages there so far (for CpuAtFirst)
    def count(self) -> int: ...                         # messages a reader reads (read_committed)
    def span(self, launched: float) -> Span: ...        # first delivered message to the last
    def discard(self) -> None: ...                      # once measured


class TopicOutput:
    """A Kafka topic as an Output: counted by its watermarks (or, `committed`, as a read_committed
    consumer reads it) and timed by its append times (`topic_span`)."""

    def __init__(self, bootstrap: str, topic: str, committed: bool = False) -> None:
        self.bootstrap, self.topic, self.committed = bootstrap, topic, committed
        self._consumer: Consumer | None = None

    def prepare(self) -> None:
        create_topic(self.bootstrap, self.topic)

    @contextmanager
    def opened(self) -> Iterator[TopicOutput]:
        with consumer(self.bootstrap) as c:
            self._consumer = c
            try:
                yield self
            finally:
                self._consumer = None

    def delivered(self) -> int:
        assert self._consumer is not None, "TopicOutput used outside opened()"
        return in_kafka(self._consumer, self.topic)

    def count(self) -> int:
        return committed_messages(self.bootstrap, self.topic) if self.committed else self.delivered()

    def span(self, launched: float) -> Span:
        return topic_span(self.bootstrap, self.topic, launched, "read_committed")

    def discard(self) -> None:
        """Topics stay (as before: small, and the broker's retention is not what is measured)."""


class BenchChild(ChildProcess):
    """A baseline run as a process of its own: `python -m <module> <json arguments>`, which prints
    one JSON line (its report) last; stopped by its pid."""

    def __init__(self, module: str, arguments: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.module, self.arguments, self.env = module, arguments, env or {}
        self.log_path = Path(tempfile.mkstemp(prefix=f"bench-{module.rsplit('.', 1)[-1]}-", suffix=".log")[1])

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, json.dumps(self.arguments)]

    def environ(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), **self.env}

    def check_alive(self) -> None:
        """Raise, with the end of its log, if it ended with an error."""
        if self.returncode not in (None, 0):
            raise RuntimeError(f"{self.module} ended with {self.returncode}: {self.log()[-2000:]}")

    def stop(self) -> None:
        """Stop it by its pid (if it still runs) and delete its log."""
        super().stop()
        self.log_path.unlink(missing_ok=True)

    def reported(self) -> dict[str, Any]:
        """Its last output line, as JSON (after it ended with status 0)."""
        lines = [line for line in self.log().splitlines() if line.startswith("{")]
        if self.returncode != 0 or not lines:
            raise RuntimeError(f"{self.module} reported nothing (exit {self.returncode}): {self.log()[-2000:]}")
        return dict(json.loads(lines[-1]))


def rate_of(events: int, span: Span) -> float:
    return events / span.drain_s if span.drain_s > 0 else math.nan

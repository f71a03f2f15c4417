"""Steady-state latency of one contender: a pipeline running, a writer committing at a fixed rate.

`steady_state` runs one contender (bench.scenarios.steady says which, in which order and how many
rounds) on a database and a topic of its own, started at the current time (nothing to catch up)
and warmed up with WARM_UP_EVENTS awaited in Kafka (a JVM's start and a producer's first metadata
are start-up, not steady state). The writer (bench.writer) is a child process doing what a service
does: one transaction per write holding the business documents and their outbox events, reporting
how far behind its schedule it ran (a saturated writer shows there and in the rate it reached,
not as latency).

Latency of an event = the broker's append time of its Kafka message (the topic has
`message.timestamp.type=LogAppendTime`) minus the commit's oplog `wall` time (the server's clock,
ms; one machine, one clock); the same messages also from the moment the writer's commit returned,
with the commit round trip as that figure's uncertainty. The relay's own share
(`relay_read_to_ack_seconds`: reading a change to Kafka's acknowledgement, in exactly-once mode to
its transaction's commit) comes from its histogram over the measured writes, p50 and p99
interpolated within buckets as Prometheus' `histogram_quantile` does. A live read_committed
consumer in this process notes when each event first arrives (`visible`, from the same oplog wall
time; in exactly-once mode a message is visible only once its transaction commits); it runs for
every contender alike, since its fetches cost the broker about a tenth of a core even when idle.

A contender on NATS JetStream (the relay with RELAY_BROKER=nats) publishes into a stream of its own
instead (its `sink`, bench.jetstream.StreamSink): the latency is then to the message's stored time
in the stream (JetStream stamps it with the server's clock when it stores it, as Kafka's append
time), and the live reader is an ordered push consumer of the stream. Everything else is the same.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Message
from pymongo import MongoClient

from bench.common import consumer, create_topic, in_kafka, log, percentile, rate, read_topic, wait_for
from bench.events import EventFactory
from bench.relay_process import Buckets
from bench.sampling import Sampler, Usage, stack_roles
from bench.writer import receive, writer_child
from relay.dev.stack import LocalStack
from relay.outbox import Outbox

WARM_UP_EVENTS = 100   # published and awaited before the measured ones
WARM_UP_TIMEOUT_S = 240.0  # a Connect worker's JVM starts within it
OBJECT_ID = re.compile(r"[0-9a-f]{24}")


@dataclass
class Latency:
    """One contender's result in one steady-state round (ms; NaN when nothing was received)."""

    target_rate: float
    batch: int                 # events per transaction
    written: int
    write_seconds: float
    achieved_rate: float       # events written / seconds the writer took
    received: int
    missing: int
    duplicates: int
    # From the commit's oplog wall time (server clock) to the broker's append: the headline.
    p50_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    # The same messages from the moment the writer's commit returned (writer's clock).
    returned_p50_ms: float
    returned_p99_ms: float
    returned_max_ms: float
    insert_p50_ms: float       # the commit round trip: the commit happened somewhere inside it
    insert_p99_ms: float
    insert_max_ms: float
    writer_max_behind_ms: float
    cpu_us_per_event: float    # the contender's process during the writes
    mongod_cpu_us_per_event: float
    peak_rss_mb: float
    other_cores: float
    contender: str = "relay"
    writer_p99_behind_ms: float = math.nan
    own_p50_ms: float = math.nan  # the relay's own share (relay_read_to_ack_seconds)
    own_p99_ms: float = math.nan
    # When a live read_committed consumer first received it.
    visible_p50_ms: float = math.nan
    visible_p99_ms: float = math.nan
    error: str | None = None
    round: int = 0
    idle_cores_before: float = math.nan  # mongod + broker CPU just before the round (bench.sampling.wait_idle)

    @property
    def reached(self) -> bool:
        """The writer kept its rate: at most 5% under the target (else the round measures a
        saturated machine, not the contender)."""
        return not self.error and self.achieved_rate >= 0.95 * self.target_rate


@dataclass
class Running:
    """A started contender: how to check it is alive, its process (its CPU and RSS count), and
    its own-share histogram (the relay's)."""

    check_alive: Callable[[], None]
    pid: int | None
    own_share: Callable[[], Buckets] | None = None


Arrival = tuple[str, float]  # (event id, the broker's append or stored time in ms)


class Sink(Protocol):
    """Where a contender's messages land: created before it starts, counted while it runs, watched
    by a live reader, and read back (event id, append time) once the writes are in."""

    def prepare(self) -> None: ...
    def counting(self) -> AbstractContextManager[Callable[[], int]]: ...
    def live(self) -> Any: ...  # something whose stop() returns {event id: first seen (s)}
    def arrivals(self, expected: int) -> list[Arrival]: ...


@dataclass(frozen=True)
class Contender:
    """One pipeline of a steady-state step: its label, output topic, how to start it (at the
    current time, on its database; a context manager yielding Running), and how to find a
    message's event id; `sink`: where its messages land when that is not the Kafka topic `topic`
    (a JetStream stream, bench.jetstream.StreamSink)."""

    label: str
    topic: str
    start: Callable[[], Any]
    event_id: Callable[[Message], str]
    live: bool = True          # measure read_committed visibility with a live consumer
    sink: Sink | None = None


class KafkaSink:
    """A contender's Kafka topic (LogAppendTime) as its Sink."""

    def __init__(self, bootstrap: str, topic: str, event_id: Callable[[Message], str]) -> None:
        self.bootstrap, self.topic, self.event_id = bootstrap, topic, event_id

    def prepare(self) -> None:
        create_topic(self.bootstrap, self.topic, {"message.timestamp.type": "LogAppendTime"})

    @contextmanager
    def counting(self) -> Iterator[Callable[[], int]]:
        with consumer(self.bootstrap) as c:
            yield lambda: in_kafka(c, self.topic)

    def live(self) -> LiveReader:
        return LiveReader(self.bootstrap, self.topic, self.event_id)

    def arrivals(self, expected: int) -> list[Arrival]:
        return arrivals_of(read_topic(self.bootstrap, self.topic, expected), self.event_id)


@dataclass
class _Writes:
    """What one round's writer reported, and what was measured around it."""

    result: dict[str, Any]
    usage: Usage
    own: tuple[Buckets, Buckets]
    warm_up_ids: set[str]
    visible: dict[str, float]
    who: str


class LiveReader:
    """A read_committed consumer of `topic` on a thread: when each event id first arrived."""

    def __init__(self, bootstrap: str, topic: str, event_id: Callable[[Message], str]) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-live-{topic}",
                                   "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                   "isolation.level": "read_committed", "fetch.wait.max.ms": 5})
        self._consumer.subscribe([topic])
        self._event_id = event_id
        self.first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-live-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self._consumer.consume(500, 0.05):
                if m.error() is None:
                    self.first_seen.setdefault(self._event_id(m), time.time())

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()
        return self.first_seen


def relay_event_id(message: Message) -> str:
    return dict(message.headers() or []).get("ce_id", b"").decode()


def peer_event_id(message: Message) -> str:
    """The event id in a peer's message: Debezium's outbox router puts it in header `id`; the
    MongoDB connector's value is the outbox document, `_id` first (an ObjectId's 24 hex digits)."""
    raw = dict(message.headers() or []).get("id") or message.value() or b""
    found = OBJECT_ID.search(raw.decode(errors="replace"))
    return found.group(0) if found else ""


def histogram_quantile(q: float, before: Buckets, after: Buckets) -> float:
    """The q-quantile (0-1) of what was observed between two readings of a histogram's buckets,
    linear within the bucket that holds it (Prometheus' histogram_quantile); NaN when empty."""
    counts = [(bound, a - b) for (bound, a), (_, b) in zip(after, before, strict=True)]
    total = counts[-1][1] if counts else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in counts:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower  # above the last finite bound: that bound is all one can say
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def steady_state(stack: LocalStack, client: MongoClient[Any], factory: EventFactory, payload_bytes: int,
                 rate_per_s: float, seconds: float, batch: int, database: str, contender: Contender) -> Latency:
    """`contender` running on `database` and warmed up; a writer process commits at `rate_per_s`,
    `batch` events per transaction. The topic (or stream) is read after the run, so consuming does
    not compete with the contender; append times are set by the broker, not by when they are read."""
    sink = contender.sink or KafkaSink(stack.kafka.bootstrap_servers, contender.topic, contender.event_id)
    sink.prepare()
    outbox = Outbox(client[database]["outbox"])
    outbox.init()
    writes = _write(stack, outbox, factory, payload_bytes, rate_per_s, seconds, batch, database, contender, sink)
    expected = WARM_UP_EVENTS + len(writes.result["committed"])
    arrivals = sink.arrivals(expected)
    walls = oplog_wall_times(client, f"{database}.outbox")
    return _measured(contender, rate_per_s, batch, writes, arrivals, walls)


def _write(stack: LocalStack, outbox: Outbox, factory: EventFactory, payload_bytes: int, rate_per_s: float,
           seconds: float, batch: int, database: str, contender: Contender, sink: Sink) -> _Writes:
    """Start the writer and the contender, warm up, then let the writer run its schedule; wait
    until every written event is in Kafka (or the contender's stream)."""
    live = sink.live() if contender.live else None
    try:
        with writer_child(stack.mongo.uri, database, rate_per_s, seconds, payload_bytes, batch) as conn, \
                contender.start() as running, sink.counting() as count:
            warm_up_ids = {str(i) for i in outbox.add_many(factory.event(-1 - i) for i in range(WARM_UP_EVENTS))}
            wait_for(f"{contender.label}: warm-up events delivered", lambda: count() >= WARM_UP_EVENTS,
                     WARM_UP_TIMEOUT_S, running.check_alive)
            receive(conn, 60, "ready")
            own_before = running.own_share() if running.own_share else []
            roles = stack_roles(stack, (lambda: {"contender": running.pid}) if running.pid else None)
            with Sampler(roles, trees=frozenset({"contender"})) as sampler:
                conn.send("go")
                result = receive(conn, seconds * 3 + 120, "result")
                expected = WARM_UP_EVENTS + len(result["committed"])
                wait_for(f"{contender.label}: steady-state events delivered", lambda: count() >= expected,
                         120, running.check_alive)
            own_after = running.own_share() if running.own_share else []
            time.sleep(0.5)  # anything still in flight (duplicates) lands before the topic is read
    finally:
        visible = live.stop() if live is not None else {}
    who = "contender" if running.pid else "bench"
    return _Writes(result, sampler.stop(), (own_before, own_after), warm_up_ids, visible, who)


def _measured(contender: Contender, rate_per_s: float, batch: int, writes: _Writes, arrivals: list[Arrival],
              walls: dict[str, float]) -> Latency:
    """The round's figures from the messages' arrivals, the oplog's wall times and the writer's report."""
    result, usage, committed = writes.result, writes.usage, writes.result["committed"]
    from_wall, from_returned, duplicates = latencies_of(arrivals, committed, walls, writes.warm_up_ids)
    round_trips = sorted(t * 1000 for t in result["round_trips"])
    behind = sorted(t * 1000 for t in result["behind"])
    visible = sorted((writes.visible[e] - walls[e]) * 1000 for e in committed if e in writes.visible and e in walls)
    written, (own_before, own_after) = len(committed), writes.own
    return Latency(
        target_rate=rate_per_s, batch=batch, written=written, write_seconds=result["seconds"],
        achieved_rate=rate(written, result["seconds"]), received=len(from_returned),
        missing=written - len(from_returned), duplicates=duplicates,
        p50_ms=percentile(from_wall, 50), p99_ms=percentile(from_wall, 99),
        max_ms=from_wall[-1] if from_wall else math.nan, min_ms=from_wall[0] if from_wall else math.nan,
        returned_p50_ms=percentile(from_returned, 50), returned_p99_ms=percentile(from_returned, 99),
        returned_max_ms=from_returned[-1] if from_returned else math.nan,
        insert_p50_ms=percentile(round_trips, 50), insert_p99_ms=percentile(round_trips, 99),
        insert_max_ms=round_trips[-1] if round_trips else math.nan,
        writer_max_behind_ms=result["max_behind_s"] * 1000, writer_p99_behind_ms=percentile(behind, 99),
        cpu_us_per_event=usage.cpu_us_per_event(writes.who, written),
        mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", written),
        peak_rss_mb=usage.peak_rss_mb.get(writes.who, math.nan), other_cores=usage.other_cores,
        contender=contender.label,
        own_p50_ms=histogram_quantile(0.5, own_before, own_after) * 1000 if own_before else math.nan,
        own_p99_ms=histogram_quantile(0.99, own_before, own_after) * 1000 if own_before else math.nan,
        visible_p50_ms=percentile(visible, 50), visible_p99_ms=percentile(visible, 99),
    )


def failed(label: str, rate_per_s: float, batch: int, error: str) -> Latency:
    nan = math.nan
    return Latency(rate_per_s, batch, 0, nan, nan, 0, 0, 0, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan,
                   nan, nan, nan, nan, contender=label, error=error)


def oplog_wall_times(client: MongoClient[Any], namespace: str) -> dict[str, float]:
    """Event id -> `wall` (server wall clock, ms) of its insert's oplog entry, as Unix seconds:
    an insert of its own, or one of the operations of a transaction's `applyOps` entry."""
    query = {"$or": [{"ns": namespace, "op": "i"}, {"op": "c", "o.applyOps.ns": namespace}]}
    out: dict[str, float] = {}
    for e in client.local["oplog.rs"].find(query, {"op": 1, "o._id": 1, "o.applyOps": 1, "wall": 1}):
        if "wall" not in e:
            continue
        ops = e["o"].get("applyOps", []) if e["op"] == "c" else [e]
        for op in ops:
            if op.get("op") == "i" and (e["op"] == "i" or op.get("ns") == namespace):
                out[str(op["o"]["_id"])] = e["wall"].timestamp()
    return out


def arrivals_of(messages: list[Message], event_id: Callable[[Message], str] = relay_event_id) -> list[Arrival]:
    """(event id, append time in ms) of Kafka messages, in their order; RuntimeError when a topic
    does not carry the broker's append time."""
    out: list[Arrival] = []
    for m in messages:
        kind, append_ms = m.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError("steady-state topic does not carry LogAppendTime timestamps")
        out.append((event_id(m), float(append_ms)))
    return out


def latencies(messages: list[Message], committed: dict[str, float], walls: dict[str, float],
              warm_up_ids: set[str], event_id: Callable[[Message], str] = relay_event_id,
              ) -> tuple[list[float], list[float], int]:
    """`latencies_of` Kafka messages (`event_id`: the relay's `ce_id` header)."""
    return latencies_of(arrivals_of(messages, event_id), committed, walls, warm_up_ids)


def latencies_of(arrivals: list[Arrival], committed: dict[str, float], walls: dict[str, float],
                 warm_up_ids: set[str]) -> tuple[list[float], list[float], int]:
    """(from oplog wall, from commit returned) in ms, ascending, and the duplicate count.

    Messages are matched to writes by their event id; a repeated id is a duplicate and counts once,
    at its first append.
    """
    from_wall: list[float] = []
    from_returned: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    for eid, append_ms in arrivals:
        if eid in seen:
            duplicates += 1
            continue
        seen.add(eid)
        returned = committed.get(eid)
        if returned is not None:
            from_returned.append(append_ms - returned * 1000.0)
            if eid in walls:
                from_wall.append(append_ms - walls[eid] * 1000.0)
        elif eid not in warm_up_ids:
            log.warning("steady state: message for unknown event %s", eid)
    return sorted(from_wall), sorted(from_returned), duplicates

"""Steady-state latency: a pipeline running, a writer committing at a fixed rate, per-event latency.

Each step runs every contender (the relay; each Kafka Connect peer at its defaults and tuned by
its documentation) in turn, at the same rate with the same writer: a child process that does what a service does,
one transaction per write holding the business documents and their outbox events, and that
reports how far behind its schedule it ran (a saturated writer shows there, not as latency).
Each contender gets a database and a topic of its own, started at the current time (nothing to
catch up), warmed up with WARM_UP_EVENTS awaited in Kafka (a JVM's start and a producer's first
metadata are start-up, not steady state); the contenders' order rotates from step to step.

Latency of an event = the broker's append time of its Kafka message (topic created with
`message.timestamp.type=LogAppendTime`) minus the commit's oplog `wall` time (the server's clock,
ms; same machine, same clock). The same messages are also measured from the moment the writer's
commit returned (its own clock), with the commit round trip as the uncertainty of that figure.
For the relay, its own share (`relay_read_to_ack_seconds`: from reading a change to Kafka's
acknowledgement; in exactly-once mode to the commit of its transaction) is read from its histogram
over the measured writes, p50 and p99 interpolated within buckets as Prometheus' `histogram_quantile`
does.

What a read_committed consumer sees: for the relay's contenders (at-least-once, and exactly-once
where a message becomes visible only at its transaction's commit, after its append), a live
consumer (isolation.level=read_committed, fetch.wait.max.ms=5) runs through the step in this process
and notes when each event first arrives; `visible` = that time minus the commit's oplog wall time
(both this machine's clock). Its CPU counts in the relay's column (the same process).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaException, Message
from pymongo import MongoClient

from bench.common import (
    AGGREGATE_TYPE,
    consumer,
    create_topic,
    in_kafka,
    log,
    percentile,
    progress,
    rate,
    read_topic,
    wait_for,
)
from bench.events import EventFactory
from bench.relay_under_test import lease_token_data, relay_settings, running_relay
from bench.sampling import Sampler, stack_roles
from bench.writer import receive, writer_child
from relay.dev.stack import LocalStack
from relay.outbox import Outbox

WARM_UP_EVENTS = 100   # published and awaited before the measured ones
WARM_UP_TIMEOUT_S = 240.0  # a Connect worker's JVM starts within it
OWN_SHARE = "relay_read_to_ack_seconds"
OBJECT_ID = re.compile(r"[0-9a-f]{24}")

Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), ascending, +Inf last


@dataclass
class Latency:
    """One contender's result in one steady-state step (ms; NaN when nothing was received)."""

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
    cpu_us_per_event: float    # the contender's process during the writes (the relay: this process)
    mongod_cpu_us_per_event: float
    peak_rss_mb: float
    other_cores: float
    contender: str = "relay"
    writer_p99_behind_ms: float = math.nan
    own_p50_ms: float = math.nan  # the relay's own share (relay_read_to_ack_seconds)
    own_p99_ms: float = math.nan
    # When a live read_committed consumer first received it (relay contenders only).
    visible_p50_ms: float = math.nan
    visible_p99_ms: float = math.nan
    error: str | None = None


@dataclass
class Running:
    """A started contender: how to check it is alive, whose CPU counts, its own-share histogram."""

    check_alive: Callable[[], None]
    pid: int | None = None                       # None: this process (the relay's thread)
    own_share: Callable[[], Buckets] | None = None


@dataclass(frozen=True)
class Contender:
    """One pipeline of the steady-state step: its label, output topic, how to start it (at the
    current time, on `database`), and how to find a message's event id."""

    label: str
    topic: str
    start: Callable[[], Any]   # a context manager yielding Running
    event_id: Callable[[Message], str]
    live: bool = False         # measure read_committed visibility with a live consumer


def relay_contender(stack: LocalStack, client: MongoClient[Any], database: str, run_id: str,
                    delivery: str = "at-least-once") -> Contender:
    topic_template = f"bench.{run_id}.{database}.{{aggregateType}}"
    settings = relay_settings(stack, database, topic_template, "now")
    label = "relay"
    if delivery == "exactly-once":
        settings = settings.replace(delivery=delivery, offsets_topic=f"bench.{run_id}.{database}.offsets")
        label = "relay, exactly-once"

    @contextmanager
    def start() -> Iterator[Running]:
        leases = client[database][settings.lease_collection]
        with running_relay(settings) as runner:
            runner.start()
            # With start_at=now and no checkpoint the relay stores its opening token at once:
            # once it is there the stream is open and every later insert will be published.
            wait_for("relay stream open", lambda: lease_token_data(leases, settings.namespace)[0], 60,
                     runner.check_alive)
            registry = runner.relay.observer.registry
            yield Running(runner.check_alive, None, lambda: histogram_buckets(registry, OWN_SHARE))

    return Contender(label, topic_template.format(aggregateType=AGGREGATE_TYPE), start, relay_event_id, live=True)


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

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def peer_contender(stack: LocalStack, client: MongoClient[Any], database: str, run_id: str, which: str,
                   jars: Any) -> Contender:
    """A Kafka Connect peer ("mongo" or "debezium", at its defaults; "-tuned": tuned by its
    documentation), its change stream starting at the current cluster time."""
    from bench.peers import debezium_outbox_connector, mongodb_source_connector
    from bench.peers.connect import StandaloneWorker, tuned

    now = client.admin.command("ping")["operationTime"]
    prefix = f"bench.{run_id}.{database}"
    if which.startswith("mongo"):
        spec = mongodb_source_connector(stack.mongo.uri, database, "outbox", now, f"{prefix}.mongo")
    else:
        spec = debezium_outbox_connector(stack.mongo.uri, database, "outbox", now, f"{prefix}.debezium",
                                         AGGREGATE_TYPE)
    spec = tuned(spec) if which.endswith("-tuned") else spec

    @contextmanager
    def start() -> Iterator[Running]:
        with StandaloneWorker(jars, spec, stack.kafka.bootstrap_servers) as worker:
            worker.start()
            yield Running(worker.check_alive, worker.pid)

    return Contender(spec.label.removeprefix("peer: "), spec.topic, start, peer_event_id)


def relay_event_id(message: Message) -> str:
    return dict(message.headers() or []).get("ce_id", b"").decode()


def peer_event_id(message: Message) -> str:
    """The event id in a peer's message: Debezium's outbox router puts it in header `id`; the
    MongoDB connector's value is the outbox document, `_id` first (an ObjectId's 24 hex digits)."""
    raw = dict(message.headers() or []).get("id") or message.value() or b""
    found = OBJECT_ID.search(raw.decode(errors="replace"))
    return found.group(0) if found else ""


def histogram_buckets(registry: Any, name: str) -> Buckets:
    """A histogram's cumulative buckets from a prometheus_client registry."""
    out = [(float(s.labels["le"]), s.value) for m in registry.collect() if m.name == name
           for s in m.samples if s.name == f"{name}_bucket"]
    return sorted(out)


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
    """`contender` running on `database` and warmed up; a writer process commits at `rate_per_s`.

    The topic is read after the run, so consuming does not compete with the contender; append
    times are set by the broker, not by when they are read.
    """
    topic = contender.topic
    create_topic(stack.kafka.bootstrap_servers, topic, {"message.timestamp.type": "LogAppendTime"})
    outbox = Outbox(client[database]["outbox"])
    outbox.init()
    live = LiveReader(stack.kafka.bootstrap_servers, topic, contender.event_id) if contender.live else None
    with writer_child(stack.mongo.uri, database, rate_per_s, seconds, payload_bytes, batch) as conn, \
            contender.start() as running, consumer(stack.kafka.bootstrap_servers) as c:
        warm_up_ids = {str(i) for i in outbox.add_many(factory.event(-1 - i) for i in range(WARM_UP_EVENTS))}
        wait_for(f"{contender.label}: warm-up events in Kafka", lambda: in_kafka(c, topic) >= WARM_UP_EVENTS,
                 WARM_UP_TIMEOUT_S, running.check_alive)
        receive(conn, 60, "ready")
        own_before = running.own_share() if running.own_share else []
        roles = stack_roles(stack, (lambda: {"peer": running.pid}) if running.pid else None)
        with Sampler(roles, trees=frozenset({"peer"})) as sampler:
            conn.send("go")
            result = receive(conn, seconds * 3 + 120, "result")
            expected = WARM_UP_EVENTS + len(result["committed"])
            wait_for(f"{contender.label}: steady-state events in Kafka", lambda: in_kafka(c, topic) >= expected,
                     120, running.check_alive)
        usage = sampler.stop()
        own_after = running.own_share() if running.own_share else []
        time.sleep(0.5)  # anything still in flight (duplicates) lands before the topic is read
    if live is not None:
        live.stop()
    messages = read_topic(stack.kafka.bootstrap_servers, topic, expected)
    written = len(result["committed"])
    walls = oplog_wall_times(client, f"{database}.outbox")
    from_wall, from_returned, duplicates = latencies(messages, result["committed"], walls, warm_up_ids,
                                                     contender.event_id)
    round_trips = sorted(t * 1000 for t in result["round_trips"])
    behind = sorted(t * 1000 for t in result["behind"])
    who = "peer" if running.pid else "bench"
    visible = sorted((live.first_seen[e] - walls[e]) * 1000 for e in result["committed"]
                     if live is not None and e in live.first_seen and e in walls)
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
        cpu_us_per_event=usage.cpu_us_per_event(who, written),
        mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", written),
        peak_rss_mb=usage.peak_rss_mb.get(who, math.nan), other_cores=usage.other_cores,
        contender=contender.label,
        own_p50_ms=histogram_quantile(0.5, own_before, own_after) * 1000 if own_before else math.nan,
        own_p99_ms=histogram_quantile(0.99, own_before, own_after) * 1000 if own_before else math.nan,
        visible_p50_ms=percentile(visible, 50), visible_p99_ms=percentile(visible, 99),
    )


def steady_step(stack: LocalStack, client: MongoClient[Any], factory: EventFactory, payload_bytes: int,
                rate_per_s: float, seconds: float, batch: int, run_id: str, peers: Any, step: int,
                exactly_once: bool = False) -> list[Latency]:
    """One rate: the relay and (with `peers`, the resolved Kafka Connect jars) each peer at its
    defaults and tuned by its documentation (the tuning is for throughput: a linger of 100 ms,
    larger polls; at a low rate the defaults may be faster), each on a database of its own, in an
    order rotated by `step`; with `exactly_once`, the relay in exactly-once mode too. A contender that fails gets a result with its error; the step goes on."""
    def make(which: str) -> Callable[[str], Contender]:
        if which == "relay":
            return lambda database: relay_contender(stack, client, database, run_id)
        if which == "relay-eos":
            return lambda database: relay_contender(stack, client, database, run_id, "exactly-once")
        return lambda database: peer_contender(stack, client, database, run_id, which, peers)

    names = ["relay"] + (["relay-eos"] if exactly_once else []) + (["mongo", "mongo-tuned", "debezium", "debezium-tuned"] if peers is not None else [])
    names = names[step % len(names):] + names[:step % len(names)]
    out = []
    for which in names:
        database = f"bench_{run_id}_steady{int(rate_per_s)}_{which}"
        contender = make(which)(database)
        progress(f"steady state: {contender.label} at {rate_per_s:g} events/s for {seconds:g} s")
        try:
            out.append(steady_state(stack, client, factory, payload_bytes, rate_per_s, seconds, batch, database,
                                    contender))
        except (TimeoutError, RuntimeError, OSError, KafkaException) as exc:
            log.error("steady state: %s failed: %s", contender.label, exc)
            out.append(failed(contender.label, rate_per_s, batch, f"{type(exc).__name__}: {exc}"))
        client.drop_database(database)
    return out


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


def latencies(messages: list[Message], committed: dict[str, float], walls: dict[str, float],
              warm_up_ids: set[str], event_id: Callable[[Message], str] = relay_event_id,
              ) -> tuple[list[float], list[float], int]:
    """(from oplog wall, from commit returned) in ms, ascending, and the duplicate count.

    Messages are matched to writes by their event id (`event_id`: the relay's `ce_id` header);
    a repeated id is a duplicate and counts once, at its first append.
    """
    from_wall: list[float] = []
    from_returned: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    for m in messages:
        kind, append_ms = m.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError("steady-state topic does not carry LogAppendTime timestamps")
        eid = event_id(m)
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

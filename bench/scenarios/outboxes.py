"""Many outboxes through one change stream (issue 36, docs/outboxes.md): N sidecar relays beside
one shared relay, and one process leading P partitions through one reader. Reported, never asserted.

Run: part of `make bench` (`python -m bench.run`; `--outboxes 1,5,20` sets the counts,
`--no-outboxes` skips it; `--outboxes-events`, `--outboxes-rounds`, `--outboxes-rate`,
`--outboxes-seconds`, `--outboxes-partitions`), or alone on a stack of its own:
`.venv/bin/python -m bench.scenarios.outboxes [the same flags]` (results also in
`bench/results/outboxes.json`). Every relay runs as `outbox-relay run` processes (stopped by pid),
so each contestant's CPU and RSS are its own processes'.

**Catch-up.** For each count N two contestants, each on a fresh backlog: a new database with N
outbox collections (`outbox_00` ...) and `--outboxes-events` events in all (default 60,000),
written 100 at a time to the outboxes in turn (bench.writer.OutboxesInTurn), nothing after it.
Once mongod and the broker are idle (bench.scenarios.fair.wait_idle), the contestant starts at the
backlog's cluster time and is timed from its launch until every event is in Kafka (one topic per
run, 3 partitions):

- `sidecars`: N processes, one per outbox (RELAY_OUTBOX_COLLECTION, RELAY_OUTBOXES unset), sharing
  the database's lease collection as N services' sidecars would: N change streams.
- `shared`: one process with RELAY_OUTBOXES listing the N outboxes: one change stream (the
  database's, filtered by `ns.coll $in`; at N = 1 the collection's, as a sidecar's).
- `bare stream`: that shared stream's pipeline (relay.mongo.pipeline.StreamPlan) read raw in this
  process, nothing done with the changes: what the stream alone costs mongod, without the relay's
  own writes (checkpoints, lease renewals, heartbeats).

`--outboxes-rounds` rounds (default 3): each round rotates the order of the counts, and the order
of the three contestants of a count. Figures, medians of the rounds: events/s from the first
message's append time to the last one's (bench.scenarios.drain, the rule of every catch-up; start-up
reported apart); mongod's CPU per event and
the operations it served (serverStatus `opcounters`, per 1,000 events); the relays' CPU per event
(summed over the processes) and its part after start-up (each process's CPU from the moment it
holds the lease of every outbox it publishes, read from the lease documents); the sum of the
processes' peak RSS (sampled every 100 ms).

**Latency.** For each N, each contestant is started at the current time on a fresh database and
warmed up (WARM_UP_EVENTS in Kafka); then a writer process (bench.writer) commits
`--outboxes-rate` events/s in all (default 1,000; 0 skips this part) for `--outboxes-seconds`
(default 15), one transaction per write (its business documents and outbox events), the writes
going to the N outboxes in turn. Latency = the broker's append time (LogAppendTime) minus the
commit's oplog wall time (bench.scenarios.latency.latencies). The rate the writer reached is
reported; a step whose writer fell more than MISSED_BY short of the target is marked and left out
of the ratios.

**Partitions with one reader per process.** One outbox, a fresh backlog of the same size each
time, for each P of `--outboxes-partitions` (default 1,2,4): one relay process with
RELAY_PARTITIONS = P leading every partition (bench.scenarios.partitions.group_catch_up); the
stream that process opens (StreamPlan with P partitions: each insert's route computed by mongod)
read raw; and, for P > 1, P bare change streams with the P partitions' pipelines
(bench.scenarios.partitions.stream_cost): what one process leading P partitions opened before
issue 36. The relay no longer has that mode (one process always reads through one stream per
database), so the bare streams stand in for it. mongod's CPU per event and its operations
(opcounters) for each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from confluent_kafka import KafkaException
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from bench.common import (
    AGGREGATE_TYPE,
    RESULTS_DIR,
    Row,
    consumer,
    create_topic,
    in_kafka,
    log,
    no_nan,
    percentile,
    progress,
    rate,
    read_topic,
    wait_for,
)
from bench.events import EventFactory, Variant
from bench.relay_under_test import relay_settings
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import last_oplog_write, write_backlog
from bench.scenarios.drain import rate_of, topic_span
from bench.scenarios.fair import wait_idle
from bench.scenarios.latency import latencies
from bench.scenarios.outboxes_report import MISSED_BY, SHARED, SIDECARS, STREAM, format_outboxes, goals, label
from bench.scenarios.partitions import group_catch_up, stream_cost
from bench.stack import bench_stack
from bench.writer import OutboxesInTurn, receive, writer_child
from harness.relays import RelayProcess
from relay.config import Settings
from relay.core.namespace import Namespace
from relay.dev.stack import LocalStack
from relay.mongo.pipeline import StreamPlan

COUNTS = (1, 5, 20)
PARTITION_COUNTS = (1, 2, 4)
CHUNK = 100                # backlog events per add_many; the outboxes take turns
WARM_UP_EVENTS = 100       # latency steps: published and awaited before the measured writes
SAMPLE_S = 0.1             # RSS sampling interval (20 processes at 25 ms would cost the machine a few %)
ERRORS = (TimeoutError, RuntimeError, OSError, KafkaException, PyMongoError)
RAW = CodecOptions(document_class=RawBSONDocument)
OPCOUNTERS = ("getmore", "query", "update", "insert", "command")


@dataclass(frozen=True)
class Options:
    """What the scenario runs (the flags of `add_arguments`)."""

    counts: tuple[int, ...] = COUNTS
    events: int = 60_000
    rounds: int = 3
    rate: float = 1000.0
    seconds: float = 15.0
    partitions: tuple[int, ...] = PARTITION_COUNTS
    payload_bytes: int = 200


def add_arguments(p: argparse.ArgumentParser, skip_flag: bool = True) -> None:
    """The scenario's flags (`skip_flag`: also `--no-outboxes`, for bench.run)."""
    d = Options()
    p.add_argument("--outboxes", default=",".join(map(str, d.counts)),
                   help="outbox counts N of the many-outboxes scenario (bench/scenarios/outboxes.py; default 1,5,20)")
    if skip_flag:
        p.add_argument("--no-outboxes", dest="outboxes", action="store_const", const="",
                       help="skip the many-outboxes scenario")
    p.add_argument("--outboxes-events", type=int, default=d.events,
                   help=f"its backlog, spread over the N outboxes (default {d.events})")
    p.add_argument("--outboxes-rounds", type=int, default=d.rounds, help=f"its rounds (default {d.rounds})")
    p.add_argument("--outboxes-rate", type=float, default=d.rate,
                   help=f"its latency steps' total rate, events/s (default {d.rate:g}; 0 skips them)")
    p.add_argument("--outboxes-seconds", type=float, default=d.seconds,
                   help=f"duration of each latency step (default {d.seconds:g})")
    p.add_argument("--outboxes-partitions", default=",".join(map(str, d.partitions)),
                   help="RELAY_PARTITIONS values of one process leading every partition (default 1,2,4; '' skips)")


def options_from(p: argparse.ArgumentParser, args: argparse.Namespace) -> Options | None:
    """The Options of parsed flags (None: skipped); a bad value is reported by `p.error`."""
    def counts(flag: str, text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            p.error(f"{flag}: comma-separated whole numbers expected, got {text!r}")
        if any(v < 1 for v in values):
            p.error(f"{flag}: every value must be at least 1, got {text!r}")
        return values

    if not args.outboxes:
        return None
    options = Options(counts=counts("--outboxes", args.outboxes), events=args.outboxes_events,
                      rounds=args.outboxes_rounds, rate=args.outboxes_rate, seconds=args.outboxes_seconds,
                      partitions=counts("--outboxes-partitions", args.outboxes_partitions))
    if options.events < max(options.counts) or options.rounds < 1:
        p.error("--outboxes-events must be at least the largest outbox count, --outboxes-rounds at least 1")
    if options.rate < 0 or options.seconds <= 0 or (options.rate and int(options.rate * options.seconds) < 1):
        p.error("--outboxes-rate >= 0 and --outboxes-seconds > 0, with at least one event per step")
    return options


# ---- the outboxes and their backlog ----------------------------------------------------------------

@dataclass(frozen=True)
class Outboxes:
    """N outbox collections of one fresh database, and the backlog written into them."""

    database: str
    collections: tuple[str, ...]
    events: int = 0
    before: Timestamp | None = None  # the newest oplog write before the backlog
    seconds: float = math.nan       # writing the backlog took

    @property
    def namespaces(self) -> list[str]:
        return [f"{self.database}.{c}" for c in self.collections]

    @property
    def start_at(self) -> str:
        """RELAY_START_AT for the backlog: its cluster time's second."""
        assert self.before is not None
        return dt.datetime.fromtimestamp(self.before.time, dt.UTC).isoformat()


def create_outboxes(client: MongoClient[Any], database: str, n: int) -> tuple[Outboxes, OutboxesInTurn]:
    """N outbox collections (`Outbox.init` on each) in `database`, and a writer taking turns over them."""
    names = tuple(f"outbox_{k:02d}" for k in range(n))
    writer = OutboxesInTurn([client[database][c] for c in names])
    writer.init()
    return Outboxes(database, names), writer


def write_spread_backlog(client: MongoClient[Any], database: str, n: int, events: int,
                         factory: EventFactory) -> Outboxes:
    """`events` events written CHUNK at a time to the N outboxes in turn (see the module docstring)."""
    outboxes, writer = create_outboxes(client, database, n)
    before = last_oplog_write(client)
    started = time.perf_counter()
    for first in range(0, events, CHUNK):
        writer.add_many(factory.event(i) for i in range(first, min(first + CHUNK, events)))
    return Outboxes(database, outboxes.collections, events, before, time.perf_counter() - started)


# ---- the contestants ---------------------------------------------------------------------------------

def relay_configs(base: Settings, outboxes: Outboxes, shared: bool, tag: str) -> list[Settings]:
    """The settings of each process: one listing every outbox, or one per outbox."""
    if shared:
        return [base.replace(outboxes=",".join(outboxes.namespaces), instance_id=f"bench-{tag}-shared")]
    return [base.replace(outbox_collection=c, instance_id=f"bench-{tag}-{c}") for c in outboxes.collections]


class Launch:
    """The contestant's `outbox-relay run` processes: started together, stopped by their pids, and
    when each one held the lease of every outbox it publishes (its start-up), with its CPU then."""

    def __init__(self, configs: list[Settings], leases: Collection[Any], tag: str) -> None:
        self.logs = Path(tempfile.mkdtemp(prefix=f"bench-{tag}-"))
        self.relays = [RelayProcess(s, self.logs, f"relay-{i}") for i, s in enumerate(configs)]
        self._scopes = {s.instance_id: len(s.namespaces) for s in configs}
        self.leases = leases
        self.up_at: dict[int, float] = {}     # process index -> time.time() it held all its leases
        self.up_cpu_s: dict[int, float] = {}  # ... and its CPU seconds then

    def roles(self) -> dict[str, int | None]:
        return {f"relay-{i}": r.proc.pid if r.proc is not None else None for i, r in enumerate(self.relays)}

    def start(self) -> None:
        for r in self.relays:
            r.start()

    def check_alive(self) -> None:
        for i, r in enumerate(self.relays):
            if not r.alive:
                raise RuntimeError(f"relay process {i} stopped: {r.log()[-2000:]}")

    def poll_start_up(self) -> None:
        """Note the processes that hold every lease of theirs now (a find on the lease collection)."""
        if len(self.up_at) == len(self.relays):
            return
        docs = self.leases.find({"owner": {"$in": list(self._scopes)}}, {"owner": 1})
        held = Counter(d["owner"] for d in docs)
        for i, r in enumerate(self.relays):
            owner = r.settings.instance_id
            if i not in self.up_at and held[owner] >= self._scopes[owner] and r.proc is not None:
                self.up_at[i] = time.time()
                self.up_cpu_s[i] = _cpu_s(r.proc.pid)

    def stop(self, keep_logs: bool = False) -> None:
        """SIGTERM to every process first, then wait for each (SIGKILL after 30 s)."""
        for r in self.relays:
            if r.alive and r.proc is not None:
                r.proc.terminate()
        for r in self.relays:
            r.stop()
        if not keep_logs:
            shutil.rmtree(self.logs, ignore_errors=True)


def _cpu_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return math.nan
    return float(t.user + t.system)


@contextmanager
def launched(stack: LocalStack, client: MongoClient[Any], outboxes: Outboxes, shared: bool, topic_template: str,
             start_at: str, tag: str) -> Iterator[Launch]:
    """The contestant's processes (not started yet), stopped on exit; their logs kept on an error."""
    base = relay_settings(stack, outboxes.database, topic_template, start_at)
    launch = Launch(relay_configs(base, outboxes, shared, tag), client[outboxes.database][base.lease_collection], tag)
    ok = False
    try:
        yield launch
        ok = True
    finally:
        launch.stop(keep_logs=not ok)
        if not ok:
            log.error("relay logs kept in %s", launch.logs)


# ---- catch-up ----------------------------------------------------------------------------------------

def catch_up(stack: LocalStack, client: MongoClient[Any], outboxes: Outboxes, shared: bool, run_id: str) -> Row:
    """The contestant drains the backlog (see the module docstring); a Row of its figures."""
    n, who = len(outboxes.collections), SHARED if shared else SIDECARS
    tag = f"{who}{n}-{uuid.uuid4().hex[:4]}"
    topic_template = f"bench.{run_id}.outboxes-{tag}.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    create_topic(stack.kafka.bootstrap_servers, topic)
    with launched(stack, client, outboxes, shared, topic_template, outboxes.start_at, tag) as launch, \
            consumer(stack.kafka.bootstrap_servers) as c, \
            Sampler(stack_roles(stack, launch.roles), interval_s=SAMPLE_S) as sampler:
        ops = opcounters(client)
        started = time.time()
        launch.start()

        def done() -> bool:
            launch.poll_start_up()
            return in_kafka(c, topic) >= outboxes.events

        wait_for(f"catch-up of {label(n, who)}", done, max(300.0, outboxes.events / 100), launch.check_alive)
        ended = time.time()
        usage = sampler.stop()
        ops = opcounters(client, since=ops)
        launch.poll_start_up()
    final = _count(stack, topic)
    span = topic_span(stack.kafka.bootstrap_servers, topic, started)  # the rule every catch-up is timed by
    cpu = [usage.cpu_s.get(f"relay-{i}", math.nan) for i in range(len(launch.relays))]
    after = [cpu[i] - launch.up_cpu_s.get(i, math.nan) for i in range(len(cpu))]
    drain = span.drain_s
    per_event = 1e6 / outboxes.events
    note = (f"first to last message; start-up {span.start_up_s:.1f} s apart (leases held after "
            f"{max(launch.up_at.values(), default=math.nan) - started:.1f} s); launch to last {ended - started:.1f} s")
    if final != outboxes.events:
        note += f"; {final - outboxes.events:+d} messages against the backlog"
    return Row(label(n, who), outboxes.events, drain, rate_of(outboxes.events, span), kind="outboxes", cpu_us_per_event=sum(cpu) * per_event,
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", outboxes.events),
               peak_rss_mb=sum(usage.peak_rss_mb.get(f"relay-{i}", math.nan) for i in range(len(cpu))),
               other_cores=usage.other_cores, iowait_cores=usage.iowait_cores, note=note,
               extra={"n": n, "contestant": who, "processes": len(cpu), "drain_s": drain, "mongod_ops": ops,
                      "drain_events_per_s": rate(outboxes.events, drain),
                      "start_up_s": span.start_up_s, "all_in_s": ended - started,
                      "leases_held_s": max(launch.up_at.values(), default=math.nan) - started,
                      "start_up_cpu_s": sum(launch.up_cpu_s.values()) if launch.up_cpu_s else math.nan,
                      "after_start_up_cpu_us_per_event": sum(after) * per_event,
                      "kafka_cpu_us_per_event": usage.cpu_us_per_event("kafka", outboxes.events),
                      "cpu_s_per_process": cpu,
                      "peak_rss_mb_per_process": [usage.peak_rss_mb.get(f"relay-{i}") for i in range(len(cpu))],
                      "backlog_write_s": outboxes.seconds, "topic": topic})


def _count(stack: LocalStack, topic: str) -> int:
    time.sleep(0.5)  # anything still in flight (a duplicate) lands first
    with consumer(stack.kafka.bootstrap_servers) as c:
        return in_kafka(c, topic)


def bare_stream(stack: LocalStack, client: MongoClient[Any], plan: StreamPlan, before: Timestamp, events: int,
                name: str) -> Row:
    """The change stream a relay process opens for `plan` (StreamPlan's pipeline), read raw from
    `before` in this process, batches of 1000, until `events` inserts came: its cost to mongod
    alone, without the relay's own writes."""
    assert plan.database is not None
    db = client[plan.database]
    source = (db[plan.collection] if plan.collection else db).with_options(codec_options=RAW)
    count, deadline = 0, time.monotonic() + max(300.0, events / 100)
    with Sampler(stack_roles(stack)) as sampler:
        ops = opcounters(client)
        started = time.perf_counter()
        with source.watch(plan.stages("aggregateId"), start_at_operation_time=before, batch_size=1000,
                          max_await_time_ms=500) as stream:
            while count < events:
                change = stream.try_next()
                if change is not None and change["operationType"] == "insert":
                    count += 1
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: {count} of {events} events")
        seconds = time.perf_counter() - started
        usage = sampler.stop()
        ops = opcounters(client, since=ops)
    return Row(name, count, seconds, rate(count, seconds), kind="outboxes",
               cpu_us_per_event=usage.cpu_us_per_event("bench", count),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores, note="the relay's pipeline, read raw in this process",
               extra={"mongod_ops": ops, "stages": plan.stages("aggregateId")})


def opcounters(client: MongoClient[Any], since: dict[str, int] | None = None) -> dict[str, int]:
    """mongod's serverStatus `opcounters` (OPCOUNTERS), or their growth since `since`."""
    counters = client.admin.command("serverStatus")["opcounters"]
    return {k: int(counters[k]) - (since or {}).get(k, 0) for k in OPCOUNTERS}


# ---- latency -----------------------------------------------------------------------------------------

@dataclass
class Step:
    """One contestant's latency step: ms from the commit's oplog wall time to the broker's append
    (NaN when nothing was measured); `kept` when the writer reached the target (within MISSED_BY)."""

    n: int
    shared: bool
    target_rate: float
    batch: int = 1
    written: int = 0
    reached_rate: float = math.nan
    received: int = 0
    missing: int = 0
    duplicates: int = 0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    max_ms: float = math.nan
    writer_max_behind_ms: float = math.nan
    cpu_us_per_event: float = math.nan   # the relays' processes, summed, during the writes
    mongod_cpu_us_per_event: float = math.nan
    peak_rss_mb: float = math.nan        # sum of the processes' peaks
    other_cores: float = math.nan
    kept: bool = False
    # Launch to every stream open, before any event: the processes' CPU (summed) and mongod's.
    start_up_s: float = math.nan
    start_up_cpu_s: float = math.nan
    start_up_mongod_cpu_s: float = math.nan
    error: str | None = None


def latency_step(stack: LocalStack, client: MongoClient[Any], n: int, shared: bool, options: Options,
                 run_id: str) -> Step:
    """The contestant on N fresh outboxes, warmed up, under the writer (see the module docstring)."""
    who = SHARED if shared else SIDECARS
    tag = f"lat-{who}{n}-{uuid.uuid4().hex[:4]}"
    outboxes, writer = create_outboxes(client, f"outboxes_{run_id}_{tag.replace('-', '_')}", n)
    topic_template = f"bench.{run_id}.outboxes-{tag}.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    create_topic(stack.kafka.bootstrap_servers, topic, {"message.timestamp.type": "LogAppendTime"})
    batch = 1 if options.rate <= 2000 else max(1, round(options.rate / 100))
    factory = EventFactory(options.payload_bytes)
    since = last_oplog_write(client)
    with launched(stack, client, outboxes, shared, topic_template, "now", tag) as launch, \
            consumer(stack.kafka.bootstrap_servers) as c, \
            writer_child(stack.mongo.uri, outboxes.database, options.rate, options.seconds, options.payload_bytes,
                         batch, outboxes.collections) as conn:
        with Sampler(stack_roles(stack, launch.roles), interval_s=SAMPLE_S) as boot:
            launched_at = time.time()
            launch.start()
            # With start_at=now and no checkpoint each scope stores its opening token at once.
            wait_for(f"{label(n, who)}: every stream open", lambda: launch.leases.count_documents(
                {"_id": {"$in": outboxes.namespaces}, "resumeToken": {"$ne": None}}) == n, 180, launch.check_alive)
            start_up = (time.time() - launched_at, boot.stop())
        per_outbox = max(1, WARM_UP_EVENTS // n)
        warm_up = {str(i) for k in range(n) for i in writer.add_many(factory.event(-1 - k * per_outbox - j)
                                                                     for j in range(per_outbox))}
        wait_for(f"{label(n, who)}: warm-up events in Kafka", lambda: in_kafka(c, topic) >= len(warm_up), 240,
                 launch.check_alive)
        receive(conn, 60, "ready")
        with Sampler(stack_roles(stack, launch.roles), interval_s=SAMPLE_S) as sampler:
            conn.send("go")
            result = receive(conn, options.seconds * 3 + 120, "result")
            expected = len(warm_up) + len(result["committed"])
            wait_for(f"{label(n, who)}: the writes in Kafka", lambda: in_kafka(c, topic) >= expected, 180,
                     launch.check_alive)
        usage = sampler.stop()
        time.sleep(0.5)  # anything still in flight (a duplicate) lands before the topic is read
    messages = read_topic(stack.kafka.bootstrap_servers, topic, expected)
    from_wall, _, duplicates = latencies(messages, result["committed"],
                                         oplog_walls(client, outboxes.namespaces, since), warm_up)
    client.drop_database(outboxes.database)
    written = len(result["committed"])
    reached = rate(written, result["seconds"])
    processes = [f"relay-{i}" for i in range(len(launch.relays))]
    return Step(n, shared, options.rate, batch, written, reached, len(from_wall), written - len(from_wall), duplicates,
                percentile(from_wall, 50), percentile(from_wall, 99), from_wall[-1] if from_wall else math.nan,
                result["max_behind_s"] * 1000, sum(usage.cpu_s.get(r, math.nan) for r in processes) / written * 1e6,
                usage.cpu_us_per_event("mongod", written), sum(usage.peak_rss_mb.get(r, math.nan) for r in processes),
                usage.other_cores, kept=reached >= options.rate * (1 - MISSED_BY), start_up_s=start_up[0],
                start_up_cpu_s=sum(start_up[1].cpu_s.get(r, math.nan) for r in processes),
                start_up_mongod_cpu_s=start_up[1].cpu_s.get("mongod", math.nan))


def oplog_walls(client: MongoClient[Any], namespaces: list[str], since: Timestamp) -> dict[str, float]:
    """Event id -> the `wall` time (Unix seconds, server clock) of its insert into one of `namespaces`
    after `since`: an insert of its own, or one of a transaction's `applyOps`. As
    bench.scenarios.latency.oplog_wall_times, for several outboxes, reading the oplog after `since` only."""
    wanted = set(namespaces)
    query = {"ts": {"$gt": since}, "$or": [{"ns": {"$in": namespaces}, "op": "i"},
                                           {"op": "c", "o.applyOps.ns": {"$in": namespaces}}]}
    out: dict[str, float] = {}
    for e in client.local["oplog.rs"].find(query, {"op": 1, "ns": 1, "o._id": 1, "o.applyOps": 1, "wall": 1}):
        if "wall" not in e:
            continue
        for op in e["o"].get("applyOps", []) if e["op"] == "c" else [e]:
            if op.get("op") == "i" and op.get("ns") in wanted:
                out[str(op["o"]["_id"])] = e["wall"].timestamp()
    return out


# ---- the scenario ------------------------------------------------------------------------------------

def catch_up_order(counts: list[int], r: int) -> list[tuple[int, str]]:
    """Round `r`'s (N, contestant) order: the counts rotated by r, and each count's three
    contestants rotated by r plus the count's place, so each comes first in turn."""
    k = r % len(counts)
    out: list[tuple[int, str]] = []
    for n in counts[k:] + counts[:k]:
        j = (r + counts.index(n)) % 3
        who = [SIDECARS, SHARED, STREAM]
        out += [(n, w) for w in who[j:] + who[:j]]
    return out


def _catch_up_round(stack: LocalStack, client: MongoClient[Any], options: Options, n: int, who: str,
                    run_id: str, r: int) -> Row:
    database = f"outboxes_{run_id}_{uuid.uuid4().hex[:6]}"
    progress(f"[outboxes, round {r + 1}/{options.rounds}] {label(n, who)}: writing a backlog of "
             f"{options.events:,} over {n} outbox(es)")
    outboxes = write_spread_backlog(client, database, n, options.events, EventFactory(options.payload_bytes))
    idle = wait_idle(stack)
    try:
        if who == STREAM:
            plan = StreamPlan(tuple(Namespace(outboxes.database, c) for c in outboxes.collections), 1, outboxes.database)
            assert outboxes.before is not None
            row = bare_stream(stack, client, plan, outboxes.before, outboxes.events, label(n, who))
            row.extra.update(n=n, contestant=who, backlog_write_s=outboxes.seconds)
        else:
            row = catch_up(stack, client, outboxes, who == SHARED, run_id)
    except ERRORS as exc:
        log.error("outboxes: %s failed: %s", label(n, who), exc)
        row = Row(label(n, who), options.events, math.nan, math.nan, kind="outboxes",
                  error=f"{type(exc).__name__}: {exc}", extra={"n": n, "contestant": who})
    row.extra.update(round=r, idle_cores_before=idle)
    client.drop_database(database)
    progress(f"  {row.scenario}: {row.events_per_s:,.0f} events/s, mongod {row.mongod_cpu_us_per_event:.0f} µs/event"
             + (f" FAILED {row.error}" if row.error else ""))
    return row


PARTITION_KINDS = {"relay": "one relay process, RELAY_PARTITIONS={k}",
                   "stream": "the relay's stream for {k} partition(s), read raw",
                   "streams": "{k} bare partition streams (before issue 36)"}


def _partitions_round(stack: LocalStack, client: MongoClient[Any], options: Options, run_id: str, r: int) -> list[Row]:
    """For each P: one relay process leading P partitions, its stream read raw, and (P > 1) P bare
    partition streams; each on a fresh backlog, the order rotated by the round."""
    entries = [(kind, k) for kind in PARTITION_KINDS for k in options.partitions if kind != "streams" or k > 1]
    entries = entries[r % len(entries):] + entries[:r % len(entries)]
    variant = Variant("outboxes-partitions", f"{options.payload_bytes} B generic", options.payload_bytes, False,
                      options.events)
    rows = []
    for kind, k in entries:
        database = f"outboxes_{run_id}_p{uuid.uuid4().hex[:6]}"
        progress(f"[outboxes, partitions, round {r + 1}/{options.rounds}] {PARTITION_KINDS[kind].format(k=k)}")
        backlog = write_backlog(client, database, variant)
        idle = wait_idle(stack)
        try:
            ops = opcounters(client)
            if kind == "relay":
                row = group_catch_up(stack, client, backlog, run_id, k, 1, tag=f"outboxes-p{k}-{uuid.uuid4().hex[:4]}")
            elif kind == "stream":
                plan = StreamPlan((Namespace(database, backlog.collection),), k, database)
                row = bare_stream(stack, client, plan, backlog.before, backlog.events, PARTITION_KINDS[kind].format(k=k))
            else:
                row = stream_cost(stack, client, backlog, k)
            row.extra["mongod_ops"] = opcounters(client, since=ops)
        except ERRORS as exc:
            log.error("outboxes: %s failed: %s", PARTITION_KINDS[kind].format(k=k), exc)
            row = Row(PARTITION_KINDS[kind].format(k=k), backlog.events, math.nan, math.nan,
                      error=f"{type(exc).__name__}: {exc}")
        row.kind = kind
        row.extra.update(round=r, idle_cores_before=idle, k=k)
        rows.append(row)
        client.drop_database(database)
    return rows


def outboxes_scenario(stack: LocalStack, client: MongoClient[Any], options: Options, run_id: str) -> dict[str, Any]:
    """Every part of the scenario (see the module docstring); the results as plain data (JSON)."""
    result: dict[str, Any] = {"options": asdict(options), "load_average_at_start": os.getloadavg(),
                              "catch_up": [], "latency": [], "partitions": []}
    started = time.monotonic()
    for r in range(options.rounds):
        for n, who in catch_up_order(list(options.counts), r):
            result["catch_up"].append(asdict(_catch_up_round(stack, client, options, n, who, run_id, r)))
    for i, n in enumerate(options.counts if options.rate else ()):
        for shared in (False, True) if i % 2 == 0 else (True, False):
            who = SHARED if shared else SIDECARS
            progress(f"[outboxes] latency: {label(n, who)} at {options.rate:g} events/s for {options.seconds:g} s")
            try:
                step = latency_step(stack, client, n, shared, options, run_id)
            except ERRORS as exc:
                log.error("outboxes: latency of %s failed: %s", label(n, who), exc)
                step = Step(n, shared, options.rate, error=f"{type(exc).__name__}: {exc}")
            result["latency"].append(asdict(step))
    for r in range(options.rounds if options.partitions else 0):
        result["partitions"] += [asdict(row) for row in _partitions_round(stack, client, options, run_id, r)]
    result["load_average_at_end"] = os.getloadavg()
    result["wall_seconds"] = time.monotonic() - started
    result["goals"] = goals(result)
    return result


# ---- alone -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios.outboxes", description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_arguments(p, skip_flag=False)
    options = options_from(p, p.parse_args(argv))
    assert options is not None
    with bench_stack() as (stack, client):
        result = outboxes_scenario(stack, client, options, uuid.uuid4().hex[:8])
    print("\n".join(format_outboxes(result)))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "outboxes.json"
    path.write_text(json.dumps(no_nan(result), indent=2, default=str) + "\n")
    progress(f"results: {path}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

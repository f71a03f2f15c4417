"""The relay benchmark: catch-up vs bare clients and Kafka Connect peers, latency, memory.

Run: `.venv/bin/python -m bench.run [--events N] [--rate R] [--seconds S] [--payload-bytes B]
[--no-peers]` (`make bench` runs it with the defaults; two to three minutes on two quiet cores,
about half that with `--no-peers`). See BENCHMARKS.md for a run and what each figure means.

Everything runs on a fresh local stack (`relay.devstack.LocalStack` in a temporary folder,
one mongod replica-set member and one Kafka broker, topics with 3 partitions), stopped by
its own `stop()` and deleted at the end. The relay runs in this process, in a thread, with
its default settings except addresses, database, topic and `http_port=0`. The benchmark's
own clients (backlog writer, lease poller, consumers) share the process and its GIL with it;
the steady-state writer is a child process, like a real service.

Scenarios, in this order:
1. `backlog insert` (set-up, not a rating): N outbox events written with
   `Outbox.add_many` in chunks of 1000 into a fresh database, no transaction.
2. `relay catch-up`: the relay is started on that backlog; measured from just before its
   thread starts to the server time (`checkpointAt`) of the first checkpoint that covers
   the last backlog event. Includes relay start-up (connection checks, lease, stream open).
3. `baseline: bare change stream`: pymongo `watch()` on the same collection from before the
   backlog, RawBSONDocument, batch_size 1000, reading N inserts and nothing else.
4. `baseline: bare producer`: a confluent_kafka Producer with exactly the relay's producer
   configuration (`Settings.kafka_config()`: idempotence, acks=all, linger.ms=5, lz4) sending
   N copies of a relay message (same value, key shape and headers) to a fresh topic, flush.
5. `steady state`: a writer child process (4 threads, one `insert_one` per event, default
   majority write concern) follows a fixed schedule of `--rate` events/s for `--seconds`;
   the relay was started first and warmed up with 100 events. Latency per event = the
   broker's append time of its Kafka message (topic created with
   `message.timestamp.type=LogAppendTime`) minus the wall-clock time the writer's
   `insert_one` returned (same machine, same clock). Because that return can be seen late
   on a loaded host, the same messages are also measured from the insert's oplog `wall`
   time (server clock), and the insert round trip is reported as the uncertainty.
Between 4 and 5, unless `--no-peers`: the peers (`bench.peers`), each in its own Kafka Connect
standalone worker JVM started for it, drain the same backlog into the same broker, one after the
other, with nothing else of the benchmark running (see `peer_catch_up`):
   `peer: Debezium MongoDB + outbox router` (Debezium's MongoDB connector + MongoEventRouter) and
   `peer: MongoDB Kafka source connector` (the official connector, publish.full.document.only).
   Both start their change stream at the backlog's start, like the relay; events/s are from the
   connector's start (the worker's "Creating connector" log line) until all N messages are in
   the output topic; the JVM's start-up before that, the all-in and drain-only rates, the JVM's
   peak RSS and CPU, and the CPU other processes took meanwhile are reported beside them. Their
   jars are resolved with Maven once (before the stack starts, so never timed) into
   ~/.cache/outbox-relay/bench-peers-*.
Before anything is measured, one idempotent message is produced, so nobody pays for a
fresh broker's coordinator start-up (see `warm_up_kafka`).
Memory: peak RSS of this process (ru_maxrss) and VmRSS around the catch-up; for each peer, the
peak RSS (VmHWM) of its Connect JVM.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import logging
import math
import multiprocessing
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import bson
import confluent_kafka
import pymongo
from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from confluent_kafka import (
    OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from pymongo import MongoClient
from pymongo.collection import Collection

from relay.config import Settings
from relay.devstack import LocalStack
from relay.outbox import Outbox, OutboxEvent
from relay.wiring import build_relay

log = logging.getLogger("bench")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
AGGREGATES = 1000          # backlog and steady-state events are spread over this many aggregate ids
CHUNK = 1000               # events per insert_many while writing the backlog
PARTITIONS = 3             # partitions of every topic the benchmark creates
AGGREGATE_TYPE = "bench"   # every event's aggregateType (so each scenario has one topic)
POLL_S = 0.02              # how often waits poll the lease document or the watermarks
WRITER_THREADS = 4         # steady-state writer threads sharing one schedule (in a child process)
WARM_UP_EVENTS = 100       # steady state: events published before the measured ones


# ---- small measurement helpers ------------------------------------------------------------------

def vm_rss_kb() -> int:
    """This process's resident set size now (VmRSS from /proc/self/status), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def peak_rss_kb() -> int:
    """This process's peak resident set size so far (ru_maxrss; KiB on Linux). Children excluded."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def cpu_seconds() -> float:
    """User + system CPU time this process used so far (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _host_jiffies() -> tuple[int, int]:
    """(busy, iowait) CPU jiffies of the whole host so far, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    user, nice, system, _idle, iowait, irq, softirq, steal = values
    return user + nice + system + irq + softirq + steal, iowait


def _process_jiffies(pid: int) -> int:
    """utime + stime of process `pid` so far (all its threads), in jiffies; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


class HostCpu:
    """CPU used during an interval: by the processes under test, and by everything else.

    `ours()` lists the pids that belong to the measurement (this process, mongod, the Kafka
    broker, a peer's JVM); it is asked at the start and at the end, so a process launched in
    between counts from zero. `other_cores` = host busy time - our processes' time, divided by
    the interval: how many cores other work on the machine (other users, other test runs) took
    while we measured. On a quiet machine it is close to 0. `iowait_cores`: idle time spent
    waiting for the disk, host-wide (a shared disk slows mongod's journal and Kafka's log).
    """

    def __init__(self, ours: Callable[[], list[int]]) -> None:
        self._ours = ours
        self._start_host = _host_jiffies()
        self._start_pids = {pid: _process_jiffies(pid) for pid in ours()}
        self._start_wall = time.monotonic()
        self.other_cores = math.nan
        self.our_cores = math.nan
        self.host_busy_cores = math.nan
        self.iowait_cores = math.nan

    def stop(self) -> HostCpu:
        busy, iowait = _host_jiffies()
        ticks = os.sysconf("SC_CLK_TCK")
        seconds = time.monotonic() - self._start_wall
        ours = sum(_process_jiffies(pid) - self._start_pids.get(pid, 0) for pid in self._ours())
        if seconds > 0:
            self.host_busy_cores = (busy - self._start_host[0]) / ticks / seconds
            self.our_cores = ours / ticks / seconds
            self.other_cores = max(0.0, self.host_busy_cores - self.our_cores)
            self.iowait_cores = (iowait - self._start_host[1]) / ticks / seconds
        return self


def stack_pids(stack: LocalStack) -> list[int]:
    """This process, the mongod processes and the Kafka broker: the processes every scenario uses."""
    procs = [*stack.mongo.processes, stack.kafka.process]
    return [os.getpid(), *(p.pid for p in procs if p is not None and p.pid is not None)]


class RssSampler:
    """Samples VmRSS every 25 ms in a thread; `peak_kb` is the highest value seen."""

    def __init__(self, interval_s: float = 0.025) -> None:
        self.interval_s = interval_s
        self.peak_kb = vm_rss_kb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_kb = max(self.peak_kb, vm_rss_kb())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, vm_rss_kb())


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (p in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def rate(events: int, seconds: float) -> float:
    return events / seconds if seconds > 0 else math.nan


def wait_until(what: str, check: Callable[[], Any], timeout_s: float,
               alive: Callable[[], None] = lambda: None) -> Any:
    """Poll `check` every POLL_S until it returns a truthy value; `alive` may raise to abort."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        alive()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not done after {timeout_s:.0f}s")
        time.sleep(POLL_S)


# ---- events -------------------------------------------------------------------------------------

class EventFactory:
    """Outbox events with a payload document of about `payload_bytes` BSON bytes.

    The payload's filler is random base64 text, so lz4 cannot shrink it to nothing (real
    payloads compress somewhat; a run of one repeated letter would flatter the Kafka side).
    """

    def __init__(self, payload_bytes: int) -> None:
        overhead = len(bson.encode({"seq": 0, "data": ""}))
        self.filler_chars = max(0, payload_bytes - overhead)
        self._pool = base64.b64encode(os.urandom(self.filler_chars * 3 + 4096)).decode()

    def payload(self, seq: int) -> dict[str, Any]:
        start = (seq * 7919) % (len(self._pool) - self.filler_chars)
        return {"seq": seq, "data": self._pool[start:start + self.filler_chars]}

    def event(self, seq: int) -> OutboxEvent:
        return OutboxEvent.new(AGGREGATE_TYPE, aggregate_id(seq), "BenchEvent", self.payload(seq))


def aggregate_id(seq: int) -> str:
    return f"agg-{seq % AGGREGATES:04d}"


# ---- the relay in a thread ----------------------------------------------------------------------

class RelayThread:
    """Runs `Relay.run()` in a daemon thread and keeps the exception that ended it."""

    def __init__(self, settings: Settings) -> None:
        self.relay = build_relay(settings)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"relay-{settings.database}", daemon=True)

    def _run(self) -> None:
        try:
            self.relay.run()
        except BaseException as exc:  # noqa: BLE001 - reported by check_alive()
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def check_alive(self) -> None:
        """Raise if the relay thread ended (it only ends on `stop()` or an error)."""
        if not self._thread.is_alive():
            raise RuntimeError(f"the relay stopped during the benchmark: {self.error!r}") from self.error

    def stop(self) -> None:
        self.relay.stop()
        self._thread.join(timeout=60)
        if self._thread.is_alive():
            log.warning("relay thread did not stop within 60 s")


@contextmanager
def running_relay(settings: Settings) -> Iterator[RelayThread]:
    runner = RelayThread(settings)
    try:
        yield runner
    finally:
        runner.stop()


def relay_settings(stack: LocalStack, database: str, topic_template: str, start_at: str) -> Settings:
    """The relay's settings: defaults, plus the stack's addresses and this scenario's names."""
    return Settings.load(env={}, flags={
        "mongodb_uri": stack.mongo.uri,
        "kafka_bootstrap_servers": stack.kafka.bootstrap_servers,
        "database": database,
        "topic_template": topic_template,
        "start_at": start_at,
        "http_port": 0,
        "instance_id": f"bench-{os.getpid()}-{database}",
    })


def lease_token_data(leases: Collection[Any], lease_id: str) -> tuple[str | None, dt.datetime | None]:
    """The stored checkpoint (`resumeToken._data`) and its `checkpointAt`, if any."""
    doc = leases.find_one({"_id": lease_id}, {"resumeToken": 1, "checkpointAt": 1})
    token = (doc or {}).get("resumeToken") or {}
    data = token.get("_data")
    return (data if isinstance(data, str) else None), (doc or {}).get("checkpointAt")


# ---- Kafka helpers -------------------------------------------------------------------------------

def create_topic(bootstrap: str, topic: str, config: dict[str, str] | None = None) -> None:
    """Create `topic` with PARTITIONS partitions (and topic config) and wait until it exists."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config or {})])
    futures[topic].result(timeout=30)
    wait_until(f"topic {topic} in metadata",
               lambda: len(admin.list_topics(topic, timeout=5).topics[topic].partitions) == PARTITIONS, 30)


@contextmanager
def consumer(bootstrap: str) -> Iterator[Consumer]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        yield c
    finally:
        c.close()


def high_watermark_sum(c: Consumer, topic: str) -> int:
    """Sum over the topic's partitions of the high watermark (= messages appended, no deletes)."""
    return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
               for p in range(PARTITIONS))


def read_topic(bootstrap: str, topic: str, expected: int, timeout_s: float = 120) -> list[Any]:
    """Every message of `topic` from the beginning, once `expected` are there."""
    with consumer(bootstrap) as c:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        messages: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(messages) < expected:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"read {len(messages)} of {expected} messages from {topic}")
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is None:
                    messages.append(m)
                else:
                    log.warning("consumer: %s", m.error())
        return messages


def sample_message(bootstrap: str, topic: str) -> Any:
    """One message the relay published (its value, key and headers feed the producer baseline)."""
    return read_topic(bootstrap, topic, 1)[0]


# ---- scenarios -----------------------------------------------------------------------------------

@dataclass
class Row:
    """One throughput line of the table."""

    scenario: str
    events: int
    seconds: float
    events_per_s: float
    relay_over_baseline: float | None = None
    note: str = ""


@dataclass
class Backlog:
    """What the catch-up and the change stream baseline need to know about the backlog."""

    database: str
    collection: str
    events: int
    before: Timestamp            # a cluster time before the first backlog event
    last_token_data: str         # resume token `_data` of the last backlog event
    row: Row


def last_oplog_write(client: MongoClient[Any]) -> Timestamp:
    """The optime of the newest write on the primary (`hello.lastWrite.opTime.ts`)."""
    return client.admin.command("hello")["lastWrite"]["opTime"]["ts"]  # type: ignore[no-any-return]


def token_of_event(coll: Collection[Any], since: Timestamp, event_id: Any) -> str:
    """The resume token `_data` of the insert of `event_id`, read from a change stream at `since`.

    `since` must be at or before that insert (any earlier inserts are skipped).
    """
    pipeline = [{"$match": {"operationType": "insert"}}]
    with coll.watch(pipeline, start_at_operation_time=since, max_await_time_ms=1000) as stream:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            change = stream.try_next()
            if change is not None and change["documentKey"]["_id"] == event_id:
                return str(change["_id"]["_data"])
    raise TimeoutError(f"did not find the insert of {event_id} in the change stream")


def write_backlog(client: MongoClient[Any], database: str, events: int, factory: EventFactory) -> Backlog:
    """Insert `events` outbox events in chunks (the set-up of the catch-up scenario)."""
    coll = client[database]["outbox"]
    outbox = Outbox(coll)
    outbox.init()
    before = last_oplog_write(client)
    chunk_start_ts = before
    last_id: Any = None
    started = time.perf_counter()
    with client.start_session(causal_consistency=False) as session:
        for first in range(0, events, CHUNK):
            if session.operation_time is not None:
                chunk_start_ts = session.operation_time  # at or before every insert that follows
            ids = outbox.add_many((factory.event(i) for i in range(first, min(first + CHUNK, events))),
                                  session=session)
            last_id = ids[-1]
    seconds = time.perf_counter() - started
    last_data = token_of_event(coll, chunk_start_ts, last_id)
    return Backlog(database, "outbox", events, before, last_data,
                   Row("backlog insert (set-up)", events, seconds, rate(events, seconds),
                       note="Outbox.add_many, 1000 per call"))


@dataclass
class CatchUp:
    row: Row
    topic: str
    rss_before_kb: int
    rss_after_kb: int
    rss_peak_sampled_kb: int
    max_rss_kb: int               # ru_maxrss right after the catch-up (set-up + catch-up only)
    cpu_s: float
    in_kafka_at_checkpoint: int   # messages in the topic when the covering checkpoint was seen
    in_kafka_final: int           # messages in the topic at the end (> events: duplicates)


def relay_catch_up(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, run_id: str) -> CatchUp:
    """Start the relay on the backlog; time until a checkpoint covers the last backlog event.

    Done-condition: the lease document's `resumeToken._data` >= the `_data` of the last
    backlog event's own resume token. Resume tokens' `_data` is the hex of a KeyString
    whose order is the stream's order (cluster time first; at an equal cluster time a
    high-water-mark token sorts before the event), so a stored token strictly before the
    last event's token cannot cover it, and one at or past it covers every backlog event.
    The end time is that checkpoint's `checkpointAt` (server clock, ms, same machine), so the
    20 ms polling does not inflate the time.

    The relay promises to store a token only after Kafka acknowledged every event before
    it, so at that moment the topic must already hold all N messages (acks=all: the high
    watermark has moved before the ack). The benchmark checks this instead of trusting it:
    if fewer are there, the run is flagged (`in_kafka_at_checkpoint`) and the time runs
    until the last message is in Kafka too.
    """
    topic_template = f"bench.{run_id}.catchup.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    create_topic(stack.kafka.bootstrap_servers, topic)
    start_at = dt.datetime.fromtimestamp(backlog.before.time, dt.timezone.utc).isoformat()
    settings = relay_settings(stack, backlog.database, topic_template, start_at)
    leases = client[backlog.database][settings.lease_collection]

    def covered() -> dt.datetime | None:
        data, at = lease_token_data(leases, settings.namespace)
        return at if data is not None and data >= backlog.last_token_data else None

    with consumer(stack.kafka.bootstrap_servers) as c:
        rss_before = vm_rss_kb()
        cpu_before = cpu_seconds()
        with RssSampler() as sampler, running_relay(settings) as runner:
            started_wall = time.time()
            runner.start()
            checkpoint_at = wait_until("relay catch-up", covered, max(120.0, backlog.events / 500),
                                       runner.check_alive)
            ended = checkpoint_at.timestamp()
            in_kafka_at_checkpoint = high_watermark_sum(c, topic)
            if in_kafka_at_checkpoint < backlog.events:
                log.error("catch-up: the checkpoint covered the backlog while only %d of %d events "
                          "were in Kafka", in_kafka_at_checkpoint, backlog.events)
                wait_until("catch-up events in Kafka", lambda: high_watermark_sum(c, topic) >= backlog.events,
                           120, runner.check_alive)
                ended = max(ended, time.time())
            rss_after = vm_rss_kb()
            max_rss = peak_rss_kb()
            cpu = cpu_seconds() - cpu_before
        in_kafka_final = high_watermark_sum(c, topic)
    seconds = ended - started_wall
    note = "incl. relay start-up"
    if in_kafka_at_checkpoint < backlog.events:
        note += f"; CHECKPOINT AHEAD OF KAFKA ({in_kafka_at_checkpoint} in topic)"
    if in_kafka_final != backlog.events:
        note += f"; {in_kafka_final} messages in topic"
    row = Row("relay catch-up (to checkpoint)", backlog.events, seconds, rate(backlog.events, seconds), note=note)
    return CatchUp(row, topic, rss_before, rss_after, sampler.peak_kb, max_rss, cpu,
                   in_kafka_at_checkpoint, in_kafka_final)


def baseline_change_stream(client: MongoClient[Any], backlog: Backlog) -> Row:
    """Bare pymongo change stream over the backlog: N raw inserts read, nothing done with them."""
    coll = client[backlog.database][backlog.collection].with_options(
        codec_options=CodecOptions(document_class=RawBSONDocument))
    count = 0
    started = time.perf_counter()
    with coll.watch([{"$match": {"operationType": "insert"}}], start_at_operation_time=backlog.before,
                    batch_size=1000) as stream:
        for _ in stream:
            count += 1
            if count == backlog.events:
                break
    seconds = time.perf_counter() - started
    return Row("baseline: bare change stream", count, seconds, rate(count, seconds),
               note="watch(), RawBSONDocument, batch 1000")


def baseline_producer(stack: LocalStack, settings: Settings, sample: Any, events: int, run_id: str) -> Row:
    """Bare Producer with the relay's producer config: N copies of a relay message, then flush.

    Same value bytes, same headers, keys over the same AGGREGATES ids, a fresh topic with the
    same partition count. Events/s counts only messages whose delivery report succeeded.
    """
    topic = f"bench.{run_id}.producer"
    create_topic(stack.kafka.bootstrap_servers, topic)
    value, headers = sample.value(), sample.headers() or []
    keys = [aggregate_id(i).encode() for i in range(AGGREGATES)]
    producer = Producer(settings.kafka_config())
    outcome = {"ok": 0, "failed": 0}

    def on_delivery(err: Any, _msg: Any) -> None:
        outcome["failed" if err is not None else "ok"] += 1

    produce, poll = producer.produce, producer.poll
    started = time.perf_counter()
    for i in range(events):
        while True:
            try:
                produce(topic, value, keys[i % AGGREGATES], headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.05)
        poll(0)
    while producer.flush(1.0) > 0:
        pass
    seconds = time.perf_counter() - started
    if outcome["failed"]:
        raise RuntimeError(f"producer baseline: {outcome['failed']} deliveries failed")
    return Row("baseline: bare producer", outcome["ok"], seconds, rate(outcome["ok"], seconds),
               note=f"relay's config, value {len(value)} B + {len(headers)} headers")


# ---- peers: Kafka Connect source connectors on the same backlog ----------------------------------

@dataclass
class PeerRun:
    """One peer's catch-up of the backlog (see `peer_catch_up`); `error` says why it has no figures.

    `row` is timed from the connector's start (the worker's "Creating connector" log line) to
    the moment all N messages are in the topic, like the relay's row (relay start-up included,
    process start-up not). The JVM's own start-up before that is `worker_start_s`; the all-in
    figures count from the JVM's launch.
    """

    key: str
    label: str
    row: Row
    output: str                     # what its messages are (format, key, headers)
    topic: str = ""
    worker_start_s: float = math.nan       # JVM launch -> connector start (JVM, plugin scan, worker)
    first_message_s: float = math.nan      # connector start -> first message seen in the topic
    all_in_seconds: float = math.nan       # JVM launch -> all N messages in the topic
    all_in_events_per_s: float = math.nan  # N / all_in_seconds
    drain_events_per_s: float = math.nan   # N / (all N seen - first message seen)
    other_cores: float = math.nan   # CPU taken by other work on the host meanwhile (see HostCpu)
    iowait_cores: float = math.nan  # host-wide disk wait meanwhile (see HostCpu)
    peak_rss_kb: int = 0            # the Connect JVM's VmHWM, read as soon as all N are in Kafka
    cpu_s: float = math.nan         # the JVM's user + system CPU time, launch to all N in Kafka
    in_kafka_final: int = 0         # messages in the topic just before the JVM is stopped (> N: duplicates)
    value_bytes: int = 0            # size of one message value
    sample_value: str = ""          # the start of one message value, to show the format
    error: str | None = None


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU time of process `pid` so far (from /proc/<pid>/stat), in seconds."""
    if pid is None:
        return math.nan
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def peer_specs(stack: LocalStack, backlog: Backlog, run_id: str) -> list[Any]:
    """The two peers (`bench.peers.ConnectorSpec`), configured for this run's backlog.

    Both start their change stream at `backlog.before`, the cluster time just before the first
    backlog insert (the relay starts at that time's second).
    """
    from bench.peers import debezium_outbox_connector, mongodb_source_connector

    uri = stack.mongo.uri
    return [
        debezium_outbox_connector(uri, backlog.database, backlog.collection, backlog.before,
                                  f"bench.{run_id}.debezium", AGGREGATE_TYPE),
        mongodb_source_connector(uri, backlog.database, backlog.collection, backlog.before,
                                 f"bench.{run_id}.mongo"),
    ]


def peer_catch_up(stack: LocalStack, backlog: Backlog, spec: Any, jars: Any) -> PeerRun:
    """A Kafka Connect standalone worker with one peer connector drains the backlog.

    The output topic is created first (PARTITIONS partitions). Then the worker JVM is launched
    and the sum of the topic's high watermarks is polled every POLL_S until it reaches N (so
    the end is seen up to ~POLL_S late; the relay's end is a server timestamp). Measured:
    - events/s from the connector's start: the worker's log line "Creating connector <name>"
      (a millisecond timestamp, same clock) to all N in Kafka. Like the relay's row, this
      includes the connector's own start-up (config validation, task and producer creation,
      MongoDB connection, change stream open) but not its process's start-up;
    - the JVM's start-up before that (JVM, plugin scanning, worker and REST server), and the
      all-in rate from the JVM's launch;
    - when the first message appeared, and the rate from it to the last (drain only);
    - the JVM's peak RSS (VmHWM) and CPU time when all N are in, then the messages in the
      topic just before the JVM is stopped (more than N would be duplicates).
    A peer that fails or times out gets an error instead of figures; the run goes on.
    """
    from bench.peers import StandaloneWorker
    from bench.peers.connect import PeerError

    bootstrap = stack.kafka.bootstrap_servers
    result = PeerRun(spec.key, spec.label, Row(spec.label, backlog.events, math.nan, math.nan),
                     spec.output, spec.topic)
    try:
        create_topic(bootstrap, spec.topic)
        with consumer(bootstrap) as c, \
                StandaloneWorker(jars, spec, bootstrap, keep_log=RESULTS_DIR / f"connect-{spec.key}.log") as worker:
            first: list[float] = []

            def all_in_kafka() -> bool:
                try:
                    count = high_watermark_sum(c, spec.topic)
                except confluent_kafka.KafkaException as exc:  # e.g. leader not known yet
                    log.debug("%s: watermarks not available yet: %s", spec.label, exc)
                    return False
                if count > 0 and not first:
                    first.append(time.time())
                return count >= backlog.events

            cpu = HostCpu(lambda: [*stack_pids(stack), *([worker.pid] if worker.pid else [])])
            launched = time.time()
            worker.start()
            wait_until(f"{spec.label} catch-up", all_in_kafka, max(180.0, backlog.events / 200),
                       worker.check_alive)
            ended = time.time()
            cpu.stop()
            result.other_cores, result.iowait_cores = cpu.other_cores, cpu.iowait_cores
            result.peak_rss_kb = worker.peak_rss_kb()
            result.cpu_s = process_cpu_s(worker.pid)
            connector_started = worker.connector_started_at()
            time.sleep(1.0)  # anything still in flight (duplicates) lands before the final count
            result.in_kafka_final = high_watermark_sum(c, spec.topic)
        if connector_started is None:
            raise PeerError(f"no 'Creating connector {spec.name}' line in the worker's log")
        seconds = ended - connector_started
        result.worker_start_s = connector_started - launched
        result.first_message_s = first[0] - connector_started
        result.all_in_seconds = ended - launched
        result.all_in_events_per_s = rate(backlog.events, result.all_in_seconds)
        result.drain_events_per_s = rate(backlog.events, ended - first[0])
        result.row = Row(spec.label, backlog.events, seconds, rate(backlog.events, seconds),
                         note=f"from connector start; JVM start-up before it {result.worker_start_s:.1f} s")
        if result.in_kafka_final != backlog.events:
            result.row.note += f"; {result.in_kafka_final} messages in topic"
        value = read_topic(bootstrap, spec.topic, 1)[0].value() or b""
        result.value_bytes = len(value)
        result.sample_value = value[:400].decode(errors="replace")
    except (PeerError, TimeoutError, RuntimeError, OSError, confluent_kafka.KafkaException) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        result.row.note = f"FAILED: {str(exc).splitlines()[0][:120]}"
        log.error("%s failed: %s", spec.label, exc)
    return result


@dataclass
class Latency:
    """Steady-state result: commit (insert_one returned) to broker append time, per event."""

    target_rate: float
    written: int
    write_seconds: float
    achieved_rate: float
    received: int
    missing: int
    duplicates: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    writer_max_behind_ms: float
    warm_up_events: int
    insert_p50_ms: float   # insert_one round trip: the commit happened somewhere inside it,
    insert_p99_ms: float   # so latency "from commit" is uncertain by up to this much
    insert_max_ms: float
    # The same messages' append time minus the insert's oplog `wall` time (server clock, ms):
    # free of the writer's scheduling delays, but it is when the write began to commit.
    oplog_p50_ms: float
    oplog_p99_ms: float
    oplog_max_ms: float
    oplog_min_ms: float


class RateWriter:
    """Inserts outbox events one `insert_one` at a time on a fixed schedule; records commit times.

    Event i is due at start + i/rate. A few threads share the schedule (each takes the next
    due event), because one `insert_one` with the default majority write concern waits for
    the journal and takes over a millisecond here: a single thread cannot reach 1000/s.
    The commit time of an event is `time.time()` right after its `insert_one` returned.
    """

    def __init__(self, outbox: Outbox, factory: EventFactory, rate_per_s: float, seconds: float,
                 threads: int = WRITER_THREADS) -> None:
        self.outbox, self.factory = outbox, factory
        self.rate, self.total = rate_per_s, int(rate_per_s * seconds)
        self.committed: dict[str, float] = {}   # event id -> time.time() after insert_one returned
        self.round_trips: list[float] = []      # seconds each insert_one took (commit-time uncertainty)
        self.max_behind_s = 0.0
        self.seconds = 0.0
        self.errors: list[BaseException] = []
        self._threads = threads
        self._next = 0
        self._lock = threading.Lock()
        self._started = 0.0

    def _take(self) -> int | None:
        with self._lock:
            if self._next >= self.total or self.errors:
                return None
            self._next += 1
            return self._next - 1

    def _work(self) -> None:
        try:
            while (i := self._take()) is not None:
                ahead = self._started + i / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                else:
                    self.max_behind_s = max(self.max_behind_s, -ahead)
                event = self.factory.event(i)
                sent = time.time()
                self.outbox.add(event)
                returned = time.time()
                self.committed[event.id_str] = returned
                self.round_trips.append(returned - sent)
        except BaseException as exc:  # noqa: BLE001 - re-raised by run()
            self.errors.append(exc)

    def run(self) -> None:
        """Write every event (blocks); raises the first writer error."""
        self._started = time.monotonic()
        workers = [threading.Thread(target=self._work, name=f"bench-writer-{n}", daemon=True)
                   for n in range(self._threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        self.seconds = time.monotonic() - self._started
        if self.errors:
            raise RuntimeError(f"writer failed: {self.errors[0]!r}") from self.errors[0]


@dataclass
class WriterResult:
    committed: dict[str, float]
    seconds: float
    max_behind_s: float
    round_trips: list[float]
    rate: float


def writer_process(uri: str, database: str, rate_per_s: float, seconds: float, payload_bytes: int,
                   conn: Any) -> None:
    """Child-process entry: connect, say "ready", wait for "go", write, send the WriterResult.

    The writer runs in its own process (like a real service) so that its commit times are
    not delayed by the relay holding this process's GIL: with writer threads next to the
    relay, `time.time()` after `insert_one` was seen up to ~12 ms late (negative latencies).
    """
    try:
        with MongoClient(uri) as client:
            client.admin.command("ping")
            writer = RateWriter(Outbox(client[database]["outbox"]), EventFactory(payload_bytes),
                                rate_per_s, seconds)
            conn.send("ready")
            if conn.recv() != "go":
                return
            writer.run()
            # Plain values: a class defined here would pickle as `__mp_main__.<name>` under -m.
            conn.send({"committed": writer.committed, "seconds": writer.seconds,
                       "max_behind_s": writer.max_behind_s, "round_trips": writer.round_trips})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(f"error: {exc!r}")
    finally:
        conn.close()


@contextmanager
def writer_child(uri: str, database: str, rate_per_s: float, seconds: float,
                 payload_bytes: int) -> Iterator[Any]:
    """Start `writer_process` (spawned, so no forked threads) and yield its end of the pipe."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=writer_process, name="bench-writer",
                       args=(uri, database, rate_per_s, seconds, payload_bytes, child), daemon=True)
    proc.start()
    child.close()
    try:
        yield parent
    finally:
        parent.close()  # a child still waiting for "go" gets EOF and exits
        proc.join(timeout=30)
        if proc.is_alive():  # our own child, by its pid
            proc.terminate()
            proc.join(timeout=10)


def receive(conn: Any, timeout_s: float, what: str) -> Any:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"writer process: no {what} after {timeout_s:.0f}s")
    try:
        message = conn.recv()
    except EOFError:
        raise RuntimeError(f"writer process exited before sending its {what}") from None
    if isinstance(message, str) and message.startswith("error:"):
        raise RuntimeError(f"writer process failed: {message[6:].strip()}")
    return message


def steady_state(stack: LocalStack, client: MongoClient[Any], factory: EventFactory, rate_per_s: float,
                 seconds: float, payload_bytes: int, run_id: str) -> Latency:
    """Relay running and warmed up (start_at=now); a writer process inserts at a fixed rate.

    Latency = Kafka LogAppendTime of the event's message - time the writer's insert_one
    returned (wall clock, same host). Before the measured writes, WARM_UP_EVENTS are written
    and awaited in Kafka, so the relay's producer has its idempotence PID and metadata (its
    first batch waits for them; that is start-up, not steady state). The topic is read after
    the run, so consuming does not compete with the relay; append times are set by the
    broker, not by when we read them.
    """
    database = f"bench_{run_id}_steady"
    topic_template = f"bench.{run_id}.steady.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    create_topic(stack.kafka.bootstrap_servers, topic, {"message.timestamp.type": "LogAppendTime"})
    outbox = Outbox(client[database]["outbox"])
    outbox.init()
    settings = relay_settings(stack, database, topic_template, "now")
    leases = client[database][settings.lease_collection]
    with writer_child(stack.mongo.uri, database, rate_per_s, seconds, payload_bytes) as conn, \
            running_relay(settings) as runner, consumer(stack.kafka.bootstrap_servers) as c:
        runner.start()
        # With start_at=now and no checkpoint the relay stores its opening token at once:
        # once it is there the stream is open and every later insert will be published.
        wait_until("relay stream open", lambda: lease_token_data(leases, settings.namespace)[0],
                   60, runner.check_alive)
        warm_up_ids = {str(i) for i in outbox.add_many(
            factory.event(-1 - i) for i in range(WARM_UP_EVENTS))}
        wait_until("warm-up events in Kafka", lambda: high_watermark_sum(c, topic) >= WARM_UP_EVENTS,
                   60, runner.check_alive)
        receive(conn, 60, "ready")
        conn.send("go")
        result = WriterResult(**receive(conn, seconds * 3 + 120, "result"), rate=rate_per_s)
        expected = WARM_UP_EVENTS + len(result.committed)
        wait_until("steady-state events in Kafka", lambda: high_watermark_sum(c, topic) >= expected,
                   120, runner.check_alive)
    messages = read_topic(stack.kafka.bootstrap_servers, topic, expected)
    return latency_of(result, messages, warm_up_ids, oplog_wall_times(client, settings.namespace))


def oplog_wall_times(client: MongoClient[Any], namespace: str) -> dict[str, float]:
    """Event id -> `wall` (server wall clock, ms) of its insert's oplog entry, as Unix seconds."""
    entries = client.local["oplog.rs"].find({"ns": namespace, "op": "i"}, {"o._id": 1, "wall": 1})
    return {str(e["o"]["_id"]): e["wall"].timestamp() for e in entries if "wall" in e}


def latency_of(writer: WriterResult, messages: list[Any], warm_up_ids: set[str],
               walls: dict[str, float]) -> Latency:
    """Match messages to commit times by the `ce_id` header; summarise append - commit."""
    latencies: list[float] = []
    from_wall: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    for m in messages:
        kind, append_ms = m.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError("steady-state topic does not carry LogAppendTime timestamps")
        event_id = dict(m.headers() or []).get("ce_id", b"").decode()
        if event_id in seen:
            duplicates += 1
            continue
        seen.add(event_id)
        committed = writer.committed.get(event_id)
        if committed is not None:
            latencies.append((append_ms / 1000.0 - committed) * 1000.0)
            if event_id in walls:
                from_wall.append(append_ms - walls[event_id] * 1000.0)
        elif event_id not in warm_up_ids:
            log.warning("steady state: message for unknown event %s", event_id)
    latencies.sort()
    from_wall.sort()
    round_trips = sorted(t * 1000 for t in writer.round_trips)
    written = len(writer.committed)
    return Latency(
        target_rate=writer.rate, written=written, write_seconds=writer.seconds,
        achieved_rate=rate(written, writer.seconds), received=len(latencies),
        missing=written - len(latencies), duplicates=duplicates,
        p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99),
        max_ms=latencies[-1] if latencies else math.nan, min_ms=latencies[0] if latencies else math.nan,
        writer_max_behind_ms=writer.max_behind_s * 1000, warm_up_events=len(warm_up_ids),
        insert_p50_ms=percentile(round_trips, 50), insert_p99_ms=percentile(round_trips, 99),
        insert_max_ms=round_trips[-1] if round_trips else math.nan,
        oplog_p50_ms=percentile(from_wall, 50), oplog_p99_ms=percentile(from_wall, 99),
        oplog_max_ms=from_wall[-1] if from_wall else math.nan,
        oplog_min_ms=from_wall[0] if from_wall else math.nan,
    )


def warm_up_kafka(bootstrap: str) -> None:
    """Produce one idempotent message and wait for its ack, before anything is measured.

    A fresh KRaft broker answers the first idempotence-PID requests with "coordinator load
    in progress" for a while; whoever produces first would pay for that. After this, the
    relay and the producer baseline each pay only their own producer's start-up.
    """
    topic = "bench.warm-up"
    create_topic(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "true", "acks": "all",
                         "log_level": 3})  # the expected "coordinator load in progress" retries
    errors: list[Any] = []
    producer.produce(topic, b"warm-up", on_delivery=lambda err, _m: errors.append(err))
    if producer.flush(90) > 0 or errors != [None]:
        raise RuntimeError(f"Kafka warm-up message not acknowledged: {errors}")


# ---- the run --------------------------------------------------------------------------------------

@dataclass
class Report:
    params: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    latency: Latency | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    catch_up: dict[str, Any] = field(default_factory=dict)
    peers: list[PeerRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "throughput": [asdict(r) for r in self.rows],
                "catch_up": self.catch_up, "latency": asdict(self.latency) if self.latency else None,
                "memory": self.memory, "peers": [asdict(p) for p in self.peers]}


def run(args: argparse.Namespace) -> Report:
    """Start the stack, run every scenario, stop and delete the stack; return the results."""
    run_id = uuid.uuid4().hex[:8]
    report = Report(params={
        "events": args.events, "rate": args.rate, "seconds": args.seconds,
        "payload_bytes": args.payload_bytes, "run_id": run_id,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "pymongo": pymongo.version, "confluent_kafka": confluent_kafka.__version__,
                 "librdkafka": confluent_kafka.libversion()[0]},
        "relay_source": relay_source(),
        "load_average_at_start": os.getloadavg(),
    })
    jars, jars_error = None, None
    if args.peers:
        from bench.peers import DEBEZIUM_VERSION, KAFKA_CONNECT_VERSION, MONGO_KAFKA_VERSION, fetch_jars
        from bench.peers.connect import PeerError

        report.params["peers"] = {"kafka_connect": KAFKA_CONNECT_VERSION, "debezium": DEBEZIUM_VERSION,
                                  "mongo_kafka_connect": MONGO_KAFKA_VERSION, "java": java_version()}
        progress("resolving the peers' jars (Maven, first run only)")
        try:
            jars = fetch_jars()
        except PeerError as exc:
            jars_error = str(exc)
            log.error("peers skipped: %s", exc)
    factory = EventFactory(args.payload_bytes)
    stack = LocalStack.in_temp_dir(partitions=PARTITIONS)
    progress(f"starting MongoDB and Kafka in {stack.base_dir}")
    try:
        stack.start()
        warm_up_kafka(stack.kafka.bootstrap_servers)
        with MongoClient(stack.mongo.uri, tz_aware=True) as client:
            progress(f"writing a backlog of {args.events} events")
            backlog = write_backlog(client, f"bench_{run_id}_catchup", args.events, factory)
            progress("relay catch-up")
            relay_cpu = HostCpu(lambda: stack_pids(stack))
            catch = relay_catch_up(stack, client, backlog, run_id)
            relay_cpu.stop()
            progress("baseline: bare change stream")
            stream_row = baseline_change_stream(client, backlog)
            progress("baseline: bare producer")
            sample = sample_message(stack.kafka.bootstrap_servers, catch.topic)
            settings = relay_settings(stack, backlog.database, "unused", "now")
            producer_row = baseline_producer(stack, settings, sample, args.events, run_id)
            if args.peers:
                for spec in peer_specs(stack, backlog, run_id):
                    if jars is None:
                        peer = PeerRun(spec.key, spec.label, Row(spec.label, backlog.events, math.nan, math.nan,
                                                                 note="FAILED: jars not resolved"),
                                       spec.output, spec.topic, error=jars_error)
                    else:
                        progress(f"{spec.label} (Kafka Connect standalone)")
                        peer = peer_catch_up(stack, backlog, spec, jars)
                    report.peers.append(peer)
            progress(f"steady state: {args.rate:g} events/s for {args.seconds:g} s")
            report.latency = steady_state(stack, client, factory, args.rate, args.seconds,
                                          args.payload_bytes, run_id)
        for row in (stream_row, producer_row, *(p.row for p in report.peers if p.error is None)):
            row.relay_over_baseline = catch.row.events_per_s / row.events_per_s
        report.rows = [backlog.row, catch.row, stream_row, producer_row, *(p.row for p in report.peers)]
        report.memory = {
            "peak_rss_process_mb": peak_rss_kb() / 1024,
            "peak_rss_through_catchup_mb": catch.max_rss_kb / 1024,
            "catchup_rss_before_mb": catch.rss_before_kb / 1024,
            "catchup_rss_after_mb": catch.rss_after_kb / 1024,
            "catchup_rss_delta_mb": (catch.rss_after_kb - catch.rss_before_kb) / 1024,
            "catchup_rss_peak_sampled_mb": catch.rss_peak_sampled_kb / 1024,
            "catchup_cpu_s": catch.cpu_s,
            "value_bytes": len(sample.value()),
            "peers_peak_rss_mb": {p.key: p.peak_rss_kb / 1024 for p in report.peers if p.error is None},
        }
        report.catch_up = {"in_kafka_at_checkpoint": catch.in_kafka_at_checkpoint,
                           "in_kafka_final": catch.in_kafka_final, "backlog": args.events,
                           "message_headers": len(sample.headers() or []),
                           "other_cores": relay_cpu.other_cores, "host_busy_cores": relay_cpu.host_busy_cores,
                           "iowait_cores": relay_cpu.iowait_cores}
    finally:
        progress("stopping the stack")
        stack.stop()
        leftovers = [p.pid for p in [*stack.mongo.processes, stack.kafka.process] if p is not None and p.alive]
        if leftovers:
            log.error("stack processes still running after stop(): %s", leftovers)
        shutil.rmtree(stack.base_dir, ignore_errors=True)
        report.params["load_average_at_end"] = os.getloadavg()
    return report


def java_version() -> str:
    """`java -version`'s first line (the JVM the peers run on)."""
    from bench.peers.connect import java_binary

    try:
        out = subprocess.run([java_binary(), "-version"], capture_output=True, text=True, timeout=30)
        return (out.stderr or out.stdout).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError, RuntimeError):
        return "unknown"


def relay_source() -> str:
    """Which relay code ran: the commit, and whether relay/ differs from it in the working tree."""
    import relay

    repo = Path(relay.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "relay"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{repo} (not a git checkout)"
    return f"{head}{' + uncommitted changes in relay/' if dirty else ''} ({repo})"


def progress(text: str) -> None:
    print(f"bench: {text} ...", file=sys.stderr, flush=True)


# ---- output ---------------------------------------------------------------------------------------

def format_report(report: Report) -> str:
    p, m, lat = report.params, report.memory, report.latency
    width = max([32, *(len(r.scenario) for r in report.rows)])
    lines = [
        f"outbox-relay benchmark  events={p['events']}  payload={p['payload_bytes']} B  "
        f"steady={p['rate']:g}/s x {p['seconds']:g} s  cpus={p['host']['cpus']}  "
        f"(relay in this process; 1 mongod, 1 Kafka broker, {PARTITIONS} partitions)",
        f"relay code: {p['relay_source']}",
    ]
    if "load_average_at_start" in p:
        lines.append("load average (1/5/15 min) at start " + "/".join(f"{x:.2f}" for x in p["load_average_at_start"])
                     + (", at end " + "/".join(f"{x:.2f}" for x in p["load_average_at_end"])
                        if "load_average_at_end" in p else ""))
    lines += [
        "",
        f"{'throughput':<{width}} {'events':>8} {'seconds':>8} {'events/s':>10} {'relay/baseline':>15}  note",
    ]
    for r in report.rows:
        ratio = f"{r.relay_over_baseline:.2f}" if r.relay_over_baseline is not None else ""
        lines.append(f"{r.scenario:<{width}} {r.events:>8} {r.seconds:>8.2f} {r.events_per_s:>10.0f} "
                     f"{ratio:>15}  {r.note}")
    if report.peers:
        lines += ["", *format_peers(report, width)]
    if lat is not None:
        lines += [
            "",
            f"{'latency (insert returned -> broker append)':<44} {'events':>7} {'rate/s':>8} "
            f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}",
            f"{'steady state, target ' + format(lat.target_rate, 'g') + '/s':<44} {lat.received:>7} "
            f"{lat.achieved_rate:>8.0f} {lat.p50_ms:>7.1f} {lat.p99_ms:>7.1f} {lat.max_ms:>7.1f}",
            f"{'  same messages, from oplog wall time':<44} {'':>7} {'':>8} "
            f"{lat.oplog_p50_ms:>7.1f} {lat.oplog_p99_ms:>7.1f} {lat.oplog_max_ms:>7.1f}",
            f"  written {lat.written} in {lat.write_seconds:.1f} s (after {lat.warm_up_events} warm-up "
            f"events), missing {lat.missing}, duplicates {lat.duplicates}; min {lat.min_ms:.1f} ms "
            f"(from insert returned), {lat.oplog_min_ms:.1f} ms (from oplog wall)",
            f"  insert_one round trip p50 {lat.insert_p50_ms:.1f} / p99 {lat.insert_p99_ms:.1f} / max "
            f"{lat.insert_max_ms:.1f} ms (the commit is inside it: the uncertainty of the first row); "
            f"writer at most {lat.writer_max_behind_ms:.0f} ms behind schedule",
        ]
    if m:
        lines += [
            "",
            "memory (this Python process: relay + benchmark clients; mongod, Kafka and the writer "
            "process not included)",
            f"  {'peak RSS through set-up + catch-up (ru_maxrss)':<52} {m['peak_rss_through_catchup_mb']:7.1f} MB",
            f"  {'peak RSS whole run (ru_maxrss; + baselines, consumer)':<52} {m['peak_rss_process_mb']:7.1f} MB",
            f"  {'VmRSS before -> after catch-up':<52} {m['catchup_rss_before_mb']:7.1f} MB -> "
            f"{m['catchup_rss_after_mb']:.1f} MB (delta {m['catchup_rss_delta_mb']:+.1f} MB)",
            f"  {'VmRSS peak during catch-up (sampled every 25 ms)':<52} {m['catchup_rss_peak_sampled_mb']:7.1f} MB",
            f"  {'CPU time of the process during catch-up':<52} {m['catchup_cpu_s']:7.1f} s",
        ]
        for peer in report.peers:
            if peer.error is None:
                lines.append(f"  {'peak RSS of the Connect JVM, ' + peer.key + ' (VmHWM)':<52} "
                             f"{peer.peak_rss_kb / 1024:7.1f} MB")
    return "\n".join(lines)


def format_peers(report: Report, width: int) -> list[str]:
    """The side-by-side block: relay catch-up vs each Kafka Connect peer on the same backlog."""
    p, m = report.params, report.memory
    relay = next((r for r in report.rows if r.scenario.startswith("relay catch-up")), None)
    versions = p.get("peers", {})
    lines = [
        f"relay vs Kafka Connect peers: same backlog, same broker, one after the other (Kafka Connect "
        f"{versions.get('kafka_connect', '?')} standalone, one JVM each; Debezium {versions.get('debezium', '?')}, "
        f"mongo-kafka-connect {versions.get('mongo_kafka_connect', '?')}; {versions.get('java', '?')})",
        f"{'':<{width}} {'events/s':>9} {'JVM':>7} {'events/s':>9} {'first':>6} {'drain':>9} "
        f"{'relay/peer':>10} {'relay/peer':>10} {'peak RSS':>9} {'CPU':>6} {'other':>6} {'iowait':>6} {'value':>6}",
        f"{'':<{width}} {'connector':>9} {'start s':>7} {'all-in':>9} {'msg s':>6} {'events/s':>9} "
        f"{'all-in':>10} {'drain':>10} {'MB':>9} {'s':>6} {'cores':>6} {'cores':>6} {'B':>6}  message",
    ]
    if relay is not None and m:
        headers = report.catch_up.get("message_headers", "?")
        lines.append(f"{relay.scenario:<{width}} {relay.events_per_s:>9.0f} {'-':>7} {'-':>9} {'-':>6} {'-':>9} "
                     f"{'':>10} {'':>10} {m['peak_rss_through_catchup_mb']:>9.1f} {m['catchup_cpu_s']:>6.1f} "
                     f"{report.catch_up.get('other_cores', math.nan):>6.2f} "
                     f"{report.catch_up.get('iowait_cores', math.nan):>6.2f} "
                     f"{m['value_bytes']:>6}  Avro single-object encoding, {headers} headers, key aggregateId")
    for peer in report.peers:
        if peer.error is not None:
            lines.append(f"{peer.label:<{width}} FAILED: {peer.error.splitlines()[0][:160]}")
            continue
        all_in = relay.events_per_s / peer.all_in_events_per_s if relay else math.nan
        drain = relay.events_per_s / peer.drain_events_per_s if relay else math.nan
        lines.append(f"{peer.label:<{width}} {peer.row.events_per_s:>9.0f} {peer.worker_start_s:>7.1f} "
                     f"{peer.all_in_events_per_s:>9.0f} {peer.first_message_s:>6.1f} {peer.drain_events_per_s:>9.0f} "
                     f"{all_in:>10.2f} {drain:>10.2f} {peer.peak_rss_kb / 1024:>9.1f} {peer.cpu_s:>6.1f} "
                     f"{peer.other_cores:>6.2f} {peer.iowait_cores:>6.2f} {peer.value_bytes:>6}  {peer.output}")
    lines += [
        "  events/s connector = the row above (connector start -> all N in Kafka; the relay's: relay start -> "
        "checkpoint); JVM start = JVM launch -> connector start;",
        "  all-in = from JVM launch; first msg = connector start -> first message; drain = N / (first -> last "
        "message); relay/peer = relay's events/s (incl. its start-up) / the peer's;",
        "  peak RSS: relay = this process (ru_maxrss through set-up + catch-up), peer = its Connect JVM (VmHWM); "
        "CPU = user + system of that process (relay: during catch-up, incl. benchmark clients; peer: whole JVM);",
        "  other cores = CPU taken meanwhile by processes outside the benchmark (busy host time - ours, / seconds): "
        "near 0 on a quiet machine; larger means the figure is depressed by other load;",
        "  iowait cores = host-wide time the CPUs sat idle waiting for the disk (mongod's journal, Kafka's log "
        "and other work share one disk).",
    ]
    return lines


def write_json(report: Report) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "latest.json"
    path.write_text(json.dumps(_no_nan(report.to_json()), indent=2, default=str) + "\n")
    return path


def _no_nan(value: Any) -> Any:
    """NaN (an empty measurement) as null, so the file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000, help="backlog size for the catch-up (default 100000)")
    p.add_argument("--rate", type=float, default=1000.0, help="steady-state events per second (default 1000)")
    p.add_argument("--seconds", type=float, default=20.0, help="steady-state duration (default 20)")
    p.add_argument("--payload-bytes", type=int, default=200,
                   help="BSON size of each event's payload document (default 200)")
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="skip the Kafka Connect peers (Debezium, MongoDB connector): they take minutes")
    args = p.parse_args(argv)
    if args.events < 1 or args.rate <= 0 or args.seconds <= 0 or args.payload_bytes < 32:
        p.error("--events >= 1, --rate > 0, --seconds > 0 and --payload-bytes >= 32 are required")
    if int(args.rate * args.seconds) < 1:
        p.error("--rate x --seconds must be at least one event")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    report = run(args)
    print(format_report(report))
    print(f"\nresults: {write_json(report)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

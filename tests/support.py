"""Test helpers: run the relay (thread or process), write events, read topics, check guarantees.

The oracle (docs/faults.md): consume the topic and compare with the outbox. Every committed
outbox event is present; first occurrences per key follow commit order; duplicates appear only
in the replay window after the last checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from pymongo.database import Database
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from relay.avro.folder import SchemaFolder
from relay.config import Settings, env_name, kafka_env_name
from relay.ops.logs import setup_logging
from relay.outbox import Outbox, OutboxEvent
from relay.wiring import build

REGISTRY = SchemaFolder.bundled()
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Servers:
    mongodb_uri: str
    kafka_bootstrap: str
    stack: Any  # relay.dev.stack.LocalStack when the tests started the servers themselves


@dataclass
class CapturedLogs:
    """Log output captured by `captured_logs`: its text, and its JSON lines parsed."""

    stream: io.StringIO

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text.splitlines()]

    def errors(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["level"] == "ERROR"]


@contextlib.contextmanager
def captured_logs(fmt: str = "json", level: str = "INFO") -> Iterator[CapturedLogs]:
    """The relay's log set-up (relay.ops.logs.setup_logging) writing to a buffer, for the
    duration of the block; the root logger's handlers and level are restored after."""
    root = logging.getLogger()
    before = root.level
    capture = CapturedLogs(io.StringIO())
    handler = setup_logging(level, fmt, capture.stream)
    try:
        yield capture
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


class WaitTimeout(AssertionError, TimeoutError):
    """Raised when `wait_until` gives up: a failed test to pytest, a `TimeoutError` to the benchmarks."""


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2,
               alive: Callable[[], None] | None = None) -> Any:
    """Poll `predicate` every `interval` s until it returns a truthy value, which is returned.

    `alive` (optional) is called between polls and may raise to abort the wait, e.g. when the
    relay thread being waited on has died. Raises `WaitTimeout` after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ---- running the relay -------------------------------------------------------------------------

class RelayThread:
    """The relay in this process, for tests that do not kill it (and for the benchmarks).

    `relay`: a relay built elsewhere (the benchmarks build theirs in one place); without it,
    `build(settings, **kwargs)` (a group of partition relays with RELAY_PARTITIONS > 1). As a
    context manager: started on enter, stopped on exit.
    """

    def __init__(self, settings: Settings, relay: Any = None, **kwargs: Any) -> None:
        self.relay = relay if relay is not None else build(settings, **kwargs)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"relay-{settings.database}", daemon=True)

    def _run(self) -> None:
        try:
            self.relay.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    def check_alive(self) -> None:
        """Raise if the relay thread ended (it only ends on `stop()` or an error)."""
        if not self.thread.is_alive():
            raise RuntimeError(f"the relay stopped: {self.error!r}") from self.error

    def stop(self, timeout: float = 60) -> bool:
        """Ask the relay to stop and wait for its thread; False if it is still running."""
        self.relay.stop()
        if self.thread.is_alive():
            self.thread.join(timeout=timeout)
        return not self.thread.is_alive()

    def __enter__(self) -> RelayThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.stop(), "relay did not stop"

    def metric(self, name: str, **labels: str) -> float:
        """The relay's samples of `name` with these labels, summed over the labels not given (the
        `outbox` of a relay of one outbox, say), as /metrics would show them (0 when absent)."""
        return sum(s.value for m in self.relay.observer.registry.collect() for s in m.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def metric_labels(self, name: str, label: str) -> set[str]:
        """The values of `label` among the non-zero samples of `name`."""
        return {s.labels[label] for m in self.relay.observer.registry.collect() for s in m.samples
                if s.name == name and s.value}


def settings_env(settings: Settings) -> dict[str, str]:
    """The RELAY_* environment that reproduces `settings` in a child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    for f in dataclasses.fields(Settings):
        if f.name == "kafka":
            continue
        env[env_name(f.name)] = str(getattr(settings, f.name))
    for key, value in settings.kafka.items():
        env[kafka_env_name(key)] = value
    env["PYTHONPATH"] = str(ROOT)
    return env


class ChildProcess:
    """A child process of the test, logging to `log_path`, stopped by its pid: SIGTERM (after
    SIGCONT, in case it is paused), SIGKILL when it does not end within 30 s. Subclasses say what
    to start (`argv`) and with which environment (`environ`)."""

    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def environ(self) -> dict[str, str]:
        raise NotImplementedError

    def start(self) -> Self:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), env=self.environ(), stdout=log, stderr=subprocess.STDOUT,
                                         cwd=ROOT)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            try:
                self.terminate(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class RelayProcess(ChildProcess):
    """`outbox-relay run` as a child process, for kill and signal tests (stopped by pid).

    `module` is what `python -m <module> run` starts: `relay`, or a test wrapper that changes
    the relay's timing (tests/faults/slow_commit.py)."""

    def __init__(self, settings: Settings, log_dir: Path, name: str, extra_env: dict[str, str] | None = None,
                 module: str = "relay") -> None:
        self.settings = settings
        self.extra_env = extra_env or {}
        self.module = module
        self.log_path = log_dir / f"{name}.log"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, "run"]

    def environ(self) -> dict[str, str]:
        return settings_env(self.settings) | self.extra_env


# ---- writing events ----------------------------------------------------------------------------

@dataclass
class Written:
    """What the writers committed: event ids in commit order per aggregate."""

    per_aggregate: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    ids: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, events: Iterable[OutboxEvent]) -> None:
        with self.lock:
            for e in events:
                self.per_aggregate[e.aggregate_id].append(e.id_str)
                self.ids.add(e.id_str)

    def add_from(self, other: Written) -> None:
        """What `other` committed, after what this one did (it was written later)."""
        with self.lock:
            for aggregate, ids in other.per_aggregate.items():
                self.per_aggregate[aggregate].extend(ids)
            self.ids |= other.ids


def write_events(db: Database[Any], collection: str, total: int, writers: int = 4, max_per_txn: int = 4,
                 aggregates_per_writer: int = 40, seed: int = 1, aggregate_type: str = "order",
                 written: Written | None = None, pause: Callable[[], None] | None = None) -> Written:
    """`writers` threads commit `total` events in transactions of 1..max_per_txn events.

    Each writer owns its aggregates, so per-aggregate commit order is the writer's order; the
    payload carries a per-aggregate sequence number `seq` starting at 1.
    """
    written = written or Written()
    outbox = Outbox(db[collection])
    per_writer = [total // writers + (1 if i < total % writers else 0) for i in range(writers)]

    def writer(index: int, count: int) -> None:
        rng = random.Random(seed * 1000 + index)
        seq: dict[str, int] = defaultdict(int)
        done = 0
        with db.client.start_session() as session:
            while done < count:
                n = min(rng.randint(1, max_per_txn), count - done)
                events = []
                for _ in range(n):
                    agg = f"w{index}-a{rng.randrange(aggregates_per_writer)}"
                    seq[agg] += 1
                    events.append(OutboxEvent.new(aggregate_type, agg, "Changed",
                                                  {"seq": seq[agg], "writer": index, "note": "x" * rng.randint(0, 64)}))
                session.with_transaction(lambda s: outbox.add_many(events, session=s))
                written.add(events)
                done += n
                if pause is not None:
                    pause()

    # Daemon threads: a failed test must not keep the suite alive while its writers retry
    # (with_transaction retries for up to 120 s against a stopped server).
    threads = [threading.Thread(target=writer, args=(i, c), daemon=True) for i, c in enumerate(per_writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return written


# ---- reading topics ----------------------------------------------------------------------------

@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: str
    event: dict[str, Any]
    headers: dict[str, str]

    @property
    def id(self) -> str:
        return str(self.event["id"])

    @property
    def position(self) -> str:
        return str(self.event["source"]["position"])

    @property
    def fencing(self) -> int:
        return int(self.headers["relay_fencing_token"])


def read_topic(bootstrap: str, topic: str, timeout: float = 60, isolation: str = "read_committed",
               client: dict[str, str] | None = None) -> list[Record]:
    """Every message in `topic` up to its current end, decoded, in (partition, offset) order
    (`client`: more consumer properties, e.g. SASL credentials)."""
    return [Record(msg.topic(), msg.partition(), msg.offset(), msg.key().decode(), REGISTRY.decode(msg.value()),
                   {k: v.decode() for k, v in (msg.headers() or [])})
            for msg in read_messages(bootstrap, topic, timeout, isolation, client)]


def read_messages(bootstrap: str, topic: str, timeout: float = 60, isolation: str = "read_committed",
                  client: dict[str, str] | None = None) -> list[Message]:
    """Every message in `topic` up to its current end, undecoded, in (partition, offset) order.

    `isolation` is the consumer's `isolation.level` (librdkafka's default, read_committed: the
    messages of aborted Kafka transactions are skipped, and the end is the last stable offset;
    read_uncommitted: every message appended, the end is the high watermark). A partition is read
    once a message at or past its end, or the end-of-partition event there, was seen (the last
    offsets of a transactional topic are commit markers, never delivered as messages)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oracle-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation,
                         **(client or {})})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        parts = sorted(meta.partitions)
        ends = {p: _high_watermark(consumer, topic, p) for p in parts}
        pending = {p for p in parts if ends[p] > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        messages: list[Message] = []
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                    pending.discard(msg.partition())
                continue
            if msg.offset() >= ends[msg.partition()]:
                pending.discard(msg.partition())
                continue
            messages.append(msg)
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
        assert not pending, f"could not read partitions {pending} of {topic} to their end"
        return sorted(messages, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()


def _high_watermark(consumer: Consumer, topic: str, partition: int) -> int:
    """The partition's end offset; retries while a new topic's leadership settles."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


_admin_clients = contextlib.ExitStack()
_admins: dict[str, Any] = {}


def _admin(bootstrap: str) -> Any:
    """One admin client per cluster for polling helpers (a new client per poll costs threads and
    connections), until the test ends (`close_admin_clients`)."""
    from confluent_kafka.admin import AdminClient

    if bootstrap not in _admins:
        _admins[bootstrap] = _admin_clients.enter_context(AdminClient({"bootstrap.servers": bootstrap}))
    return _admins[bootstrap]


def close_admin_clients() -> None:
    """Close the polling helpers' admin clients (tests/conftest.py, after every test): one left
    open after its broker stopped logs librdkafka's "Connect to ... failed" lines until the
    process exits, over pytest's report."""
    _admins.clear()
    _admin_clients.close()


def release_kafka_clients() -> None:
    """Before a broker the tests started stops: close the helpers' clients, and collect garbage so
    that a client kept only by a reference cycle is destroyed while its broker still answers (a
    stopped relay's error holds the frames that hold its producer; so does the ExceptionInfo of
    a `pytest.raises` around it; librdkafka closes a client when Python frees it)."""
    close_admin_clients()
    gc.collect()


def uncommitted_messages(bootstrap: str, topic: str) -> int:
    """Offsets of `topic` that read_committed consumers cannot read yet: per partition, the high
    watermark minus the last stable offset (non-zero while a Kafka transaction is open with
    messages in the log); 0 if the topic does not exist."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(bootstrap)
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return 0
    ends = {}
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        # A partition whose leader is being elected (the topic just created, the broker just
        # restarted) answers NOT_LEADER_FOR_PARTITION for a moment: asked again for up to 30 s.
        for attempt in Retrying(stop=stop_after_delay(30), wait=wait_fixed(0.25), reraise=True,
                                retry=retry_if_exception(_leader_not_ready)):
            with attempt:
                futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in meta.partitions},
                                             isolation_level=level)
                ends[level] = {tp.partition: f.result(timeout=10).offset for tp, f in futures.items()}
    committed, appended = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
    return sum(appended[p] - committed[p] for p in appended)


def _leader_not_ready(exc: BaseException) -> bool:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in (
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART))


def topic_size(bootstrap: str, topic: str) -> int:
    """Messages appended to `topic` so far (sum of its partitions' high watermarks; 0 if absent)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "size"})
    try:
        return watermark_sum(consumer, topic)
    finally:
        consumer.close()


def watermark_sum(consumer: Consumer, topic: str) -> int:
    """`topic_size` through an existing client (for polling loops that should not open one per call)."""
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return 0
    return sum(_high_watermark(consumer, topic, p) for p in meta.partitions)


# ---- the oracle --------------------------------------------------------------------------------

@dataclass
class Verdict:
    missing: set[str]
    unexpected: set[str]
    order_violations: list[str]
    duplicates: list[Record]
    first: dict[str, Record]


def check(records: list[Record], written: Written) -> Verdict:
    """Compare the topic with what was committed: loss, per-key commit order, duplicates."""
    first: dict[str, Record] = {}
    duplicates: list[Record] = []
    partition_of: dict[str, int] = {}
    for r in records:
        if r.id in first:
            duplicates.append(r)
        else:
            first[r.id] = r
        if partition_of.setdefault(r.key, r.partition) != r.partition:
            raise AssertionError(f"key {r.key} spread over partitions {partition_of[r.key]} and {r.partition}")
    violations = []
    for agg, ids in written.per_aggregate.items():
        seen = [first[i] for i in ids if i in first]
        offsets = [r.offset for r in seen]
        if offsets != sorted(offsets):
            violations.append(f"{agg}: first occurrences out of commit order (offsets {offsets[:10]}...)")
    return Verdict(missing=written.ids - set(first), unexpected=set(first) - written.ids,
                   order_violations=violations, duplicates=duplicates, first=first)


def written_after_first_of(records: list[Any], fencing: int) -> list[Any]:
    """Per Kafka partition, the records after the first one carrying `fencing` that carry another
    token: what an older writer got in after the new one had started (in offset order)."""
    late = []
    for partition in {r.partition for r in records}:
        in_partition = [r for r in records if r.partition == partition]
        first = next((r.offset for r in in_partition if r.fencing == fencing), None)
        if first is not None:
            late += [r for r in in_partition if r.offset > first and r.fencing != fencing]
    return late


def assert_complete_and_ordered(records: list[Record], written: Written) -> Verdict:
    verdict = check(records, written)
    assert not verdict.missing, f"{len(verdict.missing)} events lost, e.g. {sorted(verdict.missing)[:5]}"
    assert not verdict.unexpected, f"unexpected events {sorted(verdict.unexpected)[:5]}"
    assert not verdict.order_violations, verdict.order_violations[:5]
    return verdict


def lease_doc(db: Database[Any], settings: Settings) -> dict[str, Any] | None:
    return db[settings.lease_collection].find_one({"_id": settings.namespace})


# ---- fault injection ---------------------------------------------------------------------------

class failpoint:
    """`configureFailPoint failCommand` for the relay's connections only (appName outbox-relay)."""

    def __init__(self, client: Any, mode: Any, **data: Any) -> None:
        self.client, self.mode, self.data = client, mode, {"appName": "outbox-relay", **data}

    def __enter__(self) -> failpoint:
        self.client.admin.command("configureFailPoint", "failCommand", mode=self.mode, data=self.data)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.admin.command("configureFailPoint", "failCommand", mode="off")


class CheckpointWatcher:
    """Polls the lease document in the background: every stored token it sees, in order, and
    each owner's first and last lease document seen."""

    def __init__(self, db: Database[Any], settings: Settings, interval: float = 0.05) -> None:
        self.db, self.settings, self.interval = db, settings, interval
        self.seen: list[str] = []
        self.first: dict[str, dict[str, Any]] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                doc = lease_doc(self.db, self.settings) or {}
            except Exception:  # noqa: BLE001 - the server may be paused or electing
                doc = {}
            token = doc.get("resumeToken")
            if token and (not self.seen or self.seen[-1] != token["_data"]):
                self.seen.append(token["_data"])
            if doc.get("owner"):
                self.first.setdefault(doc["owner"], doc)
                self.last[doc["owner"]] = doc
            self._stop.wait(self.interval)

    def __enter__(self) -> CheckpointWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def assert_never_went_backwards(self) -> None:
        for a, b in zip(self.seen, self.seen[1:]):
            assert b > a, f"checkpoint went backwards: {a} -> {b}"


class LeaseHistory:
    """Every version of every lease document, exactly, from a change stream on the lease
    collection with post-images (the collection is created with `changeStreamPreAndPostImages`
    before the relays start; MongoDB 6.0+). Unlike polling, it cannot miss a checkpoint stored
    between two looks, so it gives, per lease, the checkpoint each fencing token resumed from.
    """

    def __init__(self, db: Database[Any], settings: Settings) -> None:
        name = settings.lease_collection
        if name not in db.list_collection_names():
            db.create_collection(name, changeStreamPreAndPostImages={"enabled": True})
        else:
            db.command("collMod", name, changeStreamPreAndPostImages={"enabled": True})
        self._coll = db[name]
        self.versions: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._stop = threading.Event()
        self._stream = self._coll.watch(full_document="required", max_await_time_ms=200)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                change = self._stream.try_next()
                if change is None or "fullDocument" not in change:
                    continue
                doc = change["fullDocument"]
                token = (doc.get("resumeToken") or {}).get("_data")
                self.versions[str(doc["_id"])].append(
                    {"owner": doc.get("owner"), "fencing": int(doc.get("fencingToken") or 0), "token": token})
        except BaseException as exc:  # noqa: BLE001 - reported by the checks
            self.error = exc

    def __enter__(self) -> LeaseHistory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # the last versions still on their way
        self._stop.set()
        self._thread.join()
        self._stream.close()

    def resumed_from(self, lease: str) -> dict[int, str | None]:
        """Fencing token -> the checkpoint the lease held when that token took it (None: none)."""
        out: dict[int, str | None] = {}
        for v in self.versions.get(lease, []):
            out.setdefault(v["fencing"], v["token"])
        return out

    def assert_never_went_backwards(self) -> int:
        """Every lease's stored checkpoint only ever moved forward; returns how many stores were seen."""
        assert self.error is None, self.error
        seen = 0
        for lease, versions in self.versions.items():
            tokens = [v["token"] for v in versions if v["token"] is not None]
            for a, b in zip(tokens, tokens[1:]):
                assert b >= a, f"checkpoint of {lease} went backwards: {a} -> {b}"
            seen += len(set(tokens))
        return seen


def change_streams(client: Any, databases: Iterable[str]) -> list[dict[str, Any]]:
    """The originating commands of the relays' change stream cursors on `databases` now, idle or
    in a getMore (`$currentOp`)."""
    ops = client.admin.aggregate([
        {"$currentOp": {"idleCursors": True, "allUsers": True}},
        {"$match": {"appName": "outbox-relay", "cursor.originatingCommand.aggregate": {"$exists": True}}}])
    commands = [op["cursor"]["originatingCommand"] for op in ops]
    return [c for c in commands if c.get("$db") in set(databases) and "$changeStream" in c["pipeline"][0]]


def needs_local_stack(servers: Servers) -> Any:
    """The servers' processes, for a test that kills or pauses them (earlier tests' Kafka clients
    freed first: release_kafka_clients)."""
    import pytest

    if servers.stack is None:
        pytest.skip("kills or pauses servers: needs the servers started by the tests themselves")
    release_kafka_clients()
    return servers.stack


# ---- shared scenario steps -------------------------------------------------------------------

def background_writes(env: Any, written: Written, total: int, writers: int = 2, pause: float = 0.01,
                      max_per_txn: int = 4) -> threading.Thread:
    """Start writers committing `total` events in transactions, paced by `pause` per transaction."""
    thread = threading.Thread(target=write_events, kwargs=dict(
        db=env.db, collection=env.settings.outbox_collection, total=total, writers=writers,
        max_per_txn=max_per_txn, written=written, pause=lambda: time.sleep(pause)), daemon=True)
    thread.start()
    return thread


def all_published(env: Any, written: Written, timeout: float = 180) -> list[Record]:
    """Wait until every written event is in the topic; return the whole topic."""
    def done() -> list[Record] | None:
        records = read_topic(env.servers.kafka_bootstrap, env.topic())
        return records if {r.id for r in records} >= written.ids else None
    return wait_until(done, timeout, "every event in the topic", interval=1)


@contextlib.contextmanager
def replica_set(prefix: str, **kwargs: Any) -> Iterator[Any]:
    """A mongod replica set of its own in a fresh folder, stopped by pid and removed after."""
    from relay.dev.stack import MongoReplicaSet

    rs = MongoReplicaSet(Path(tempfile.mkdtemp(prefix=prefix)), **kwargs)
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()
        shutil.rmtree(rs.base_dir, ignore_errors=True)

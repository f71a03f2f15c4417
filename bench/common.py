"""What every benchmark scenario shares: constants, the result row, Kafka topic helpers, waits.

Waiting, reading topics and counting messages come from `harness.waiting` and
`harness.topics` (the test oracle's helpers), so the benchmark and the tests agree on what
"all N messages are in Kafka" means.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from harness.topics import read_messages, watermark_sum
from harness.waiting import wait_until

log = logging.getLogger("bench")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
AGGREGATES = 1000          # backlog and steady-state events are spread over this many aggregate ids
CHUNK = 1000               # events per insert_many while writing a backlog
PARTITIONS = 3             # partitions of every topic the benchmark creates
AGGREGATE_TYPE = "bench"   # every event's aggregateType (so each scenario has one topic)
POLL_S = 0.02              # how often waits poll the lease document or the watermarks

RELAY = "relay catch-up (to checkpoint)"
COMPARED = [  # the ratio table's rows, in order: (row label prefix, short name)
    ("peer: MongoDB Kafka source connector", "MongoDB Kafka source connector"),
    ("peer: Debezium MongoDB + outbox router", "Debezium + outbox router"),
    ("peer: Conduit + MongoDB connector", "Conduit + MongoDB connector"),
    ("baseline: bare relay", "bare relay"),
    ("baseline: bare change stream", "bare change stream"),
    ("baseline: bare producer", "bare producer"),
    ("relay catch-up, exactly-once", "relay, exactly-once (transactions)"),  # bench.scenarios.exactly_once
]


@dataclass
class Row:
    """One line of the results: who moved how many events how fast, and at what cost.

    `cpu_us_per_event` is the CPU (user + system, all threads, children included) of the
    process doing the work - the relay's, a bare baseline's or a peer's own process (from its
    first event on in the catch-up, bench.scenarios.drain), this Python process for the bare
    producer - divided by `events`; `mongod_cpu_us_per_event` the same for mongod during the
    sampled interval. `peak_rss_mb` is that process's highest RSS
    sampled during the interval. NaN: not measured (or the scenario failed: see `note`).
    """

    scenario: str
    events: int
    seconds: float
    events_per_s: float
    variant: str = ""                # payload variant the row belongs to ("" = the default one)
    kind: str = "baseline"           # relay | baseline | peer | set-up
    cpu_us_per_event: float = math.nan
    mongod_cpu_us_per_event: float = math.nan
    peak_rss_mb: float = math.nan
    other_cores: float = math.nan    # CPU other work on the host took meanwhile (see bench.sampling)
    iowait_cores: float = math.nan
    note: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def rate(events: int, seconds: float) -> float:
    return events / seconds if seconds > 0 else math.nan


def ratio(relay: Row | None, other: Row | None) -> float:
    if relay is None or other is None or other.error or not other.events_per_s > 0:
        return math.nan
    return relay.events_per_s / other.events_per_s


def no_nan(value: Any) -> Any:
    """NaN (an empty measurement) as null, so the file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_nan(v) for v in value]
    return value


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (p in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def progress(text: str) -> None:
    print(f"bench: {text} ...", file=sys.stderr, flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float,
             alive: Callable[[], None] | None = None) -> Any:
    """`harness.waiting.wait_until` at the benchmark's poll interval (raises TimeoutError too)."""
    return wait_until(check, timeout_s, what, interval=POLL_S, alive=alive)


# ---- Kafka ------------------------------------------------------------------------------------

def create_topic(bootstrap: str, topic: str, config: dict[str, str] | None = None) -> None:
    """Create `topic` with PARTITIONS partitions (and topic config) and wait until it exists.

    Every benchmark topic carries the broker's append time (LogAppendTime): the catch-up's span
    and the latencies are read from it (bench.scenarios.drain), whoever produced the message."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"message.timestamp.type": "LogAppendTime", **(config or {})}
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)])
    futures[topic].result(timeout=30)
    wait_for(f"topic {topic} in metadata",
             lambda: len(admin.list_topics(topic, timeout=5).topics[topic].partitions) == PARTITIONS, 30)


@contextmanager
def consumer(bootstrap: str) -> Iterator[Consumer]:
    """A throw-away consumer (its own group, no commits) for watermarks and reads."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        yield c
    finally:
        c.close()


def in_kafka(c: Consumer, topic: str) -> int:
    """Messages appended to `topic` so far; 0 while its partitions have no leader yet."""
    try:
        return watermark_sum(c, topic)
    except KafkaException as exc:
        log.debug("watermarks of %s not available yet: %s", topic, exc)
        return 0


def committed_messages(bootstrap: str, topic: str, timeout_s: float = 120) -> int:
    """How many messages a read_committed consumer reads from `topic`, up to each partition's last
    stable offset: what an exactly-once relay published (watermarks also count the commit markers
    and any aborted messages). Counted, not kept, with small fetch buffers, so this process's RSS
    (the relay's, in the benchmark) does not grow by the topic's size."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": "read_committed",
                  "queued.max.messages.kbytes": 4096, "fetch.max.bytes": 4 * 1024 * 1024})
    try:
        meta = c.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta.partitions}
        pending = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        count, deadline = 0, time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in c.consume(1000, 0.5):
                p = msg.partition()
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[p]:
                        pending.discard(p)
                    continue
                if msg.offset() < ends[p]:
                    count += 1
                if msg.offset() + 1 >= ends[p]:
                    pending.discard(p)
        if pending:
            raise TimeoutError(f"could not count {topic}'s partitions {sorted(pending)} to their end")
        return count
    finally:
        c.close()


def read_topic(bootstrap: str, topic: str, expected: int, timeout_s: float = 120) -> list[Message]:
    """Every message of `topic`, once at least `expected` are there, in (partition, offset) order."""
    with consumer(bootstrap) as c:
        wait_for(f"{expected} messages in {topic}", lambda: in_kafka(c, topic) >= expected, timeout_s)
    return read_messages(bootstrap, topic, timeout=timeout_s)


def first_message(bootstrap: str, topic: str, timeout_s: float = 60) -> Message:
    """One message of `topic` (the first one a fetch returns), without reading the rest: reading a
    whole 100,000-message topic here once grew this process's RSS by about 100 MB."""
    with consumer(bootstrap) as c:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = c.poll(0.5)
            if message is not None and message.error() is None:
                return message
    raise TimeoutError(f"no message in {topic} after {timeout_s:.0f}s")


def warm_up_kafka(bootstrap: str) -> None:
    """Produce one idempotent message and wait for its ack, before anything is measured.

    A fresh KRaft broker answers the first idempotence-PID requests with "coordinator load
    in progress" for a while; whoever produces first would pay for that. After this, the
    relay and the producer baselines each pay only their own producer's start-up.
    """
    topic = "bench.warm-up"
    create_topic(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "true", "acks": "all",
                         "log_level": 3})  # the expected "coordinator load in progress" retries
    errors: list[Any] = []
    producer.produce(topic, b"warm-up", on_delivery=lambda err, _m: errors.append(err))
    if producer.flush(90) > 0 or errors != [None]:
        raise RuntimeError(f"Kafka warm-up message not acknowledged: {errors}")


def warm_up_transactions(bootstrap: str) -> None:
    """Commit one transaction with a throw-away transactional id, before anything is measured.

    The first `init_transactions` on a fresh broker creates the transaction state log
    (`__transaction_state`, 50 partitions) and answers "not coordinator" until it is loaded;
    an exactly-once relay timed first would pay for that."""
    topic = "bench.warm-up"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-warm-up-{uuid.uuid4().hex[:8]}",
                         "log_level": 3})
    producer.init_transactions(120)
    producer.begin_transaction()
    producer.produce(topic, b"warm-up")
    producer.commit_transaction(60)


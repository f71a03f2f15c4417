"""Reading Kafka topics from the tests: every message up to the end, decoded (`read_topic`) or not
(`read_messages`), a topic's size and its messages in open transactions; and the helpers' Kafka
clients closed before a broker stops (`release_kafka_clients`)."""

from __future__ import annotations

import contextlib
import gc
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from relay.avro.folder import SchemaFolder

REGISTRY = SchemaFolder.bundled()


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


def read_topic(
    bootstrap: str,
    topic: str,
    timeout: float = 60,
    isolation: str = "read_committed",
    client: dict[str, str] | None = None,
) -> list[Record]:
    """Every message in `topic` up to its current end, decoded, in (partition, offset) order
    (`client`: more consumer properties, e.g. SASL credentials)."""
    return [_record(msg) for msg in read_messages(bootstrap, topic, timeout, isolation, client)]


def _record(msg: Any) -> Record:
    """A relay's message decoded (`msg`: a confluent_kafka Message read without error, so its
    topic, partition, offset, key and value are set)."""
    return Record(
        msg.topic(),
        msg.partition(),
        msg.offset(),
        msg.key().decode(),
        REGISTRY.decode(msg.value()),
        {k: v.decode() for k, v in (msg.headers() or [])},
    )


def read_messages(
    bootstrap: str,
    topic: str,
    timeout: float = 60,
    isolation: str = "read_committed",
    client: dict[str, str] | None = None,
) -> list[Message]:
    """Every message in `topic` up to its current end, undecoded, in (partition, offset) order.

    `isolation` is the consumer's `isolation.level` (librdkafka's default, read_committed: the
    messages of aborted Kafka transactions are skipped, and the end is the last stable offset;
    read_uncommitted: every message appended, the end is the high watermark). A partition is read
    once a message at or past its end, or the end-of-partition event there, was seen (the last
    offsets of a transactional topic are commit markers, never delivered as messages)."""
    consumer = _oracle_consumer(bootstrap, isolation, client)
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        parts = sorted(meta.partitions)
        ends = {p: _high_watermark(consumer, topic, p) for p in parts}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        messages, pending = _read_to_ends(consumer, ends, timeout)
        assert not pending, f"could not read partitions {pending} of {topic} to their end"
        return sorted(messages, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()


def _read_to_ends(consumer: Consumer, ends: dict[int, int], timeout: float) -> tuple[list[Message], set[int]]:
    """The assigned partitions' messages below `ends`, and the partitions not read to their end in time."""
    pending = {p for p, end in ends.items() if end > 0}
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        msg: Any = consumer.poll(0.5)  # a Message: its offset is set once it came from a fetch
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
    return messages, pending


def _oracle_consumer(bootstrap: str, isolation: str, client: dict[str, str] | None) -> Consumer:
    """A consumer of its own group that commits nothing and reports each partition's end."""
    settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": f"oracle-{uuid.uuid4().hex[:8]}"}
    settings |= {"enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation}
    return Consumer({**settings, **(client or {})})


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
        for attempt in Retrying(
            stop=stop_after_delay(30), wait=wait_fixed(0.25), reraise=True, retry=retry_if_exception(_leader_not_ready)
        ):
            with attempt:
                futures = admin.list_offsets(
                    {TopicPartition(topic, p): OffsetSpec.latest() for p in meta.partitions}, isolation_level=level
                )
                ends[level] = {tp.partition: f.result(timeout=10).offset for tp, f in futures.items()}
    committed, appended = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
    return sum(appended[p] - committed[p] for p in appended)


def _leader_not_ready(exc: BaseException) -> bool:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (
        err.retriable()
        or err.code()
        in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)
    )


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

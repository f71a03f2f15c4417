"""The offsets topic (RELAY_OFFSETS_TOPIC, exactly-once mode): created compacted at start, and
each lease's newest committed record read with read_committed (relay.kafka.offsets_record says
what a record holds; relay.core.resume where a leader resumes from it)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec
from tenacity import wait_fixed

from relay.core.config import WAIT_SLICE_S
from relay.core.errors import ConfigError, ServerUnreachableError, TransientError
from relay.core.names import env_name
from relay.core.retry import retrying
from relay.kafka.acls import OFFSETS_GROUP_PREFIX
from relay.kafka.admin import client_config
from relay.kafka.config import KafkaConfig
from relay.kafka.errors import Attempt, Treat, has_code, kafka_error, translate, treatment
from relay.kafka.offsets_record import OffsetsRecord, partition_for

log = logging.getLogger(__name__)

# Compacted; segments small enough that the cleaner keeps the part a leader reads at start (from
# the beginning of its partition) short although one record is written per transaction.
OFFSETS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": str(16 * 1024 * 1024),
    "segment.ms": str(60 * 60 * 1000),
}

Heartbeat = Callable[[], None]


class OffsetsTopic:
    """RELAY_OFFSETS_TOPIC: created compacted (or checked) at start; each lease's newest committed
    record read with read_committed. A refused ACL is a PermissionDeniedError naming the topic (or
    the reader's group) and the operation the step needs (relay.kafka.acls lists them all)."""

    def __init__(self, config: KafkaConfig) -> None:
        self._config = config
        self.topic = config.offsets_topic
        self._topic_partitions: int | None = None
        self._admin_client: AdminClient | None = None

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = AdminClient(client_config(self._config, "kafka.admin"))
        return self._admin_client

    def ensure(self) -> None:
        """Create the topic compacted, with the replication the cluster allows (3 brokers or as
        many as there are; `min.insync.replicas` one less, at least 1), or check the existing one
        is compacted: ConfigError naming RELAY_OFFSETS_TOPIC if not (delete-only retention would
        drop a lease's only record)."""
        admin, timeout = self._admin(), self._config.connect_timeout_s
        step = self._step("describe the offsets topic", "DESCRIBE")
        try:
            meta = admin.list_topics(timeout=timeout)
            error = meta.topics[self.topic].error if self.topic in meta.topics else None
            if treatment(error) is Treat.DENIED:
                raise translate(error, step)
            if self.topic not in meta.topics or error is not None:
                step = self._step("create the offsets topic", "CREATE")
                self._create(admin, max(1, min(3, len(meta.brokers))))
            step = self._step("check the offsets topic is compacted", "DESCRIBE_CONFIGS")
            configs = self._describe(admin)
        except KafkaException as exc:
            if treatment(kafka_error(exc)) is Treat.DENIED:
                raise translate(kafka_error(exc), step) from exc
            raise ServerUnreachableError(
                f"cannot create or describe the offsets topic {self.topic!r} ({env_name('offsets_topic')}) at "
                f"{self._config.bootstrap_servers}: {kafka_error(exc) or exc}"
            ) from exc
        policy = configs["cleanup.policy"].value or ""
        if "compact" not in policy.split(","):
            raise ConfigError(
                env_name("offsets_topic"),
                f"topic {self.topic!r} exists with cleanup.policy={policy}: the offsets topic must "
                "be compacted (cleanup.policy=compact), or retention deletes a lease's only "
                "record; alter it or name another topic",
            )

    def _step(self, step: str, operation: str) -> Attempt:
        """`step` on the offsets topic, which needs `operation` on it (relay.kafka.errors.translate)."""
        return Attempt(step, (("TOPIC", self.topic, operation),))

    def _create(self, admin: AdminClient, replicas: int) -> None:
        """Create the topic compacted with `replicas` replicas (another replica may be first)."""
        timeout = self._config.connect_timeout_s
        config = {**OFFSETS_TOPIC_CONFIG, "min.insync.replicas": str(max(1, replicas - 1))}
        future = admin.create_topics([NewTopic(self.topic, 1, replicas, config=config)], request_timeout=timeout)
        try:
            future[self.topic].result(timeout=timeout)
            log.info("created the offsets topic %s (compacted, replication %d)", self.topic, replicas)
        except KafkaException as exc:
            if not has_code(exc, KafkaError.TOPIC_ALREADY_EXISTS):  # another replica was first
                raise

    def _describe(self, admin: AdminClient) -> dict[str, Any]:
        """The topic's configuration; a topic created a moment ago may be unknown to the broker
        answering for a little while (metadata propagation), so that answer is retried."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        timeout = self._config.connect_timeout_s

        def describe() -> dict[str, Any]:
            configs: dict[str, Any] = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
                timeout=timeout
            )
            return configs

        def unknown(exc: BaseException) -> bool:
            return has_code(exc, KafkaError.UNKNOWN_TOPIC_OR_PART)

        return retrying(unknown, give_up_after_s=timeout, wait=wait_fixed(0.2))(describe)

    def record_partition(self, lease_id: str) -> int:
        """The topic's partition holding `lease_id`'s records (relay.kafka.offsets_record.partition_for)."""
        if self._topic_partitions is None:
            meta = self._admin().list_topics(self.topic, timeout=self._config.connect_timeout_s)
            topic = meta.topics.get(self.topic)
            if topic is not None and treatment(topic.error) is Treat.DENIED:
                raise translate(topic.error, self._step("describe the offsets topic", "DESCRIBE"))
            if topic is None or topic.error is not None or not topic.partitions:
                raise TransientError(f"the offsets topic {self.topic!r} has no partitions in the metadata yet")
            self._topic_partitions = len(topic.partitions)
        return partition_for(lease_id, self._topic_partitions)

    def _end(self, partition: int, missing_ok: bool) -> int | None:
        """The partition's high watermark (every record, committed or not); None when the topic
        does not exist and `missing_ok` (else that is a TransientError: a topic created a moment
        ago can be unknown to the broker answering, and reading on as if it had no record would
        lose the resume point)."""
        tp = TopicPartition(self.topic, partition)
        timeout = self._config.connect_timeout_s
        try:
            futures = self._admin().list_offsets(
                {tp: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=timeout
            )
            return int(futures[tp].result(timeout=timeout).offset)
        except KafkaException as exc:
            if missing_ok and has_code(exc, KafkaError.UNKNOWN_TOPIC_OR_PART):
                return None
            if treatment(kafka_error(exc)) is Treat.DENIED:
                raise translate(kafka_error(exc), self._step("list the offsets topic's offsets", "DESCRIBE")) from exc
            raise TransientError(f"cannot list the offsets of {self.topic}[{partition}]: {exc}") from exc

    def read(self, lease_id: str, heartbeat: Heartbeat, missing_ok: bool = False) -> OffsetsRecord | None:
        """The newest committed record under `lease_id`, or None (none, or a tombstone; with
        `missing_ok`, also no such topic: an at-least-once leader reads it without creating it).

        Reads the lease's partition with read_committed from its beginning up to its high
        watermark as of the call. Records of other leases' open transactions hold the
        read_committed end (the last stable offset) back until they end, so this waits until it
        passes that high watermark; every transaction of this lease ended before (its producer
        was just initialized), so its newest committed record lies below it. Gives up after the
        transaction timeout plus 30 s (TransientError: the loop restarts and tries again).
        """
        if missing_ok and self._topic_partitions is None and self._end(0, missing_ok) is None:
            return None  # no offsets topic
        partition = self.record_partition(lease_id)
        end = self._end(partition, missing_ok=False)
        if not end:
            return None
        group = f"{OFFSETS_GROUP_PREFIX}{uuid.uuid4().hex[:8]}"
        consumer = Consumer(
            {
                **client_config(self._config, "kafka.consumer"),
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        step = Attempt("read the offsets topic", (("TOPIC", self.topic, "READ"), ("GROUP", group, "READ")))
        try:
            consumer.assign([TopicPartition(self.topic, partition, OFFSET_BEGINNING)])
            newest = self._newest(consumer, lease_id.encode(), end, heartbeat, step)
        finally:
            consumer.close()
        where = f"{self.topic}[{partition}]"
        if newest is None or newest[1] is None:
            return None
        return OffsetsRecord.decode(lease_id, newest[1], f"{where}@{newest[0]}")

    def _newest(
        self, consumer: Consumer, key: bytes, end: int, heartbeat: Heartbeat, step: Attempt
    ) -> tuple[int, bytes | None] | None:
        """(offset, value) of the last record under `key` below `end` read by `consumer`, or None."""
        newest: tuple[int, bytes | None] | None = None
        limit = self._config.transaction_timeout_ms / 1000 + 30
        deadline = time.monotonic() + limit
        while True:
            heartbeat()
            msg = consumer.poll(WAIT_SLICE_S)
            offset = -1 if msg is None else (msg.offset() or 0)
            error = None if msg is None else msg.error()
            if msg is not None and error is None:
                if msg.key() == key:
                    newest = (offset, msg.value())
                if offset + 1 >= end:
                    return newest
            elif error is not None and error.code() == KafkaError._PARTITION_EOF and offset >= end:
                return newest
            elif treatment(error) is Treat.DENIED:
                raise translate(error, step)
            if time.monotonic() > deadline:
                raise TransientError(
                    f"could not read {self.topic} ({env_name('offsets_topic')}) with read_committed to offset "
                    f"{end} within {limit:.0f}s: an open transaction holds its last stable offset back"
                )

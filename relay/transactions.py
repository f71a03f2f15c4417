"""Exactly-once into Kafka (RELAY_DELIVERY=exactly-once): one Kafka transaction per delivery.

`TransactionalPublisher` implements the loop's Publisher boundary (relay.boundaries) with a
transactional producer (`transactional.id` = `outbox-relay:<lease id>`, relay.offsets). For each
delivery `send()` runs one transaction: begin, produce the delivery's messages and one record to
the compacted offsets topic (RELAY_OFFSETS_TOPIC, key = the lease id, value = the token covering
the delivery: relay.offsets.OffsetsRecord), commit. It returns only once the commit succeeded, so
a delivery the loop sees acknowledged is visible to read_committed consumers, and the MongoDB
checkpoint (written by the loop right after) never covers an event that is not. One transaction is
in flight at a time (RELAY_PIPELINE_DEPTH must be 1), bounded by RELAY_BATCH_MAX_EVENTS and
RELAY_BATCH_MAX_BYTES like any delivery.

A new leading session first calls `resume_point()`: `init_transactions` fences every earlier
producer of the lease (a zombie's open transaction is aborted, its later commits fail with a fenced
error and it goes back to standby), then the offsets topic is read with read_committed to its end,
and the leader resumes after the newer of that record and the MongoDB checkpoint
(relay.offsets.resume_point). The order matters: read before fencing, and a zombie could commit
after the read.

Errors, translated here for the one classifier (relay.errors.classify):
- fenced (`_FENCED`, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH): ProducerFencedError -> standby;
- abortable (`txn_requires_abort()`): the transaction is aborted, then the delivery's failed
  report decides as for the idempotent producer (a refused record batch is replayed one message
  per transaction to name the poison event), else TransactionAbortedError -> restart;
- fatal: ProducerFatalError -> restart with a new producer (which fences this one);
- retriable timeouts of commit/abort/init: retried in slices, serving the lease heartbeat.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING, Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from relay.changes import short_token
from relay.config import Settings, env_name, kafka_env_name
from relay.errors import (
    ConfigError, DeliveryError, ProducerFatalError, ProducerFencedError, ServerUnreachableError,
    TransactionAbortedError, TransientError, kafka_fenced,
)
from relay.lease import Checkpoint, Grant
from relay.offsets import (
    OffsetsRecord, after_exactly_once, forgets_record, partition_for, resume_point, transactional_id,
)
from relay.publisher import _config_error, _produce_error, delivery_failure
from relay.window import Delivery

log = logging.getLogger(__name__)

_WAIT_SLICE_S = 0.5  # longest one blocking Kafka call waits before the lease heartbeat runs
# Offsets topic settings: compacted; segments small enough that the cleaner keeps the part a
# leader reads at start (from the beginning of its partition) short although one record is
# written per transaction.
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": str(16 * 1024 * 1024),
                        "segment.ms": str(60 * 60 * 1000)}

Heartbeat = Callable[[], None]


def transactional_config(settings: Settings, lease_id: str) -> dict[str, Any]:
    """The producer configuration of exactly-once mode: the relay's (idempotence, acks=all forced)
    plus the lease's transactional.id and a transaction timeout no shorter than the delivery
    timeout (librdkafka refuses otherwise)."""
    return {**settings.kafka_config(), "transactional.id": transactional_id(lease_id),
            "transaction.timeout.ms": str(settings.transaction_timeout_ms)}


def check_transactional_config(settings: Settings, lease_id: str) -> None:
    """Raise ConfigError naming the property if librdkafka refuses the transactional configuration
    (building the producer contacts no broker; `init_transactions` would)."""
    try:
        Producer(transactional_config(settings, lease_id))
    except KafkaException as exc:
        raise _config_error(exc) from None


# ---- the offsets topic ----------------------------------------------------------------------

class OffsetsTopic:
    """RELAY_OFFSETS_TOPIC: created compacted (or checked) at start; each lease's newest committed
    record read with read_committed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.offsets_topic
        self._partitions: int | None = None
        self._admin_client: AdminClient | None = None

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = AdminClient({**self.settings.kafka_client_config(),
                                              "logger": logging.getLogger("kafka.admin")})
        return self._admin_client

    def ensure(self) -> None:
        """Create the topic compacted, with the replication the cluster allows (3 brokers or as
        many as there are; `min.insync.replicas` one less, at least 1), or check the existing one
        is compacted: ConfigError naming RELAY_OFFSETS_TOPIC if not (delete-only retention would
        drop a lease's only record)."""
        admin, timeout = self._admin(), self.settings.connect_timeout_s
        try:
            meta = admin.list_topics(timeout=timeout)
            if self.topic not in meta.topics or meta.topics[self.topic].error is not None:
                replicas = max(1, min(3, len(meta.brokers)))
                config = {**OFFSETS_TOPIC_CONFIG, "min.insync.replicas": str(max(1, replicas - 1))}
                future = admin.create_topics([NewTopic(self.topic, 1, replicas, config=config)],
                                             request_timeout=timeout)[self.topic]
                try:
                    future.result(timeout=timeout)
                    log.info("created the offsets topic %s (compacted, replication %d)", self.topic, replicas)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another replica was first
                        raise
            configs = self._describe(admin)
        except KafkaException as exc:
            raise ServerUnreachableError(
                f"cannot create or describe the offsets topic {self.topic!r} ({env_name('offsets_topic')}) at "
                f"{self.settings.kafka_bootstrap_servers}: {exc.args[0] if exc.args else exc}") from None
        policy = configs["cleanup.policy"].value or ""
        if "compact" not in policy.split(","):
            raise ConfigError(env_name("offsets_topic"),
                              f"topic {self.topic!r} exists with cleanup.policy={policy}: the offsets topic must "
                              "be compacted (cleanup.policy=compact), or retention deletes a lease's only "
                              "record; alter it or name another topic")

    def _describe(self, admin: AdminClient) -> dict[str, Any]:
        """The topic's configuration; a topic created a moment ago may be unknown to the broker
        answering for a little while (metadata propagation), so that answer is retried."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        timeout = self.settings.connect_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            try:
                return admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout=timeout)
            except KafkaException as exc:
                unknown = exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if not unknown or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def partition(self, lease_id: str) -> int:
        """The partition holding `lease_id`'s records (relay.offsets.partition_for)."""
        if self._partitions is None:
            meta = self._admin().list_topics(self.topic, timeout=self.settings.connect_timeout_s)
            topic = meta.topics.get(self.topic)
            if topic is None or topic.error is not None or not topic.partitions:
                raise TransientError(f"the offsets topic {self.topic!r} has no partitions in the metadata yet")
            self._partitions = len(topic.partitions)
        return partition_for(lease_id, self._partitions)

    def _end(self, partition: int, missing_ok: bool) -> int | None:
        """The partition's high watermark (every record, committed or not); None when the topic
        does not exist and `missing_ok` (else that is a TransientError: a topic created a moment
        ago can be unknown to the broker answering, and reading on as if it had no record would
        lose the resume point)."""
        tp = TopicPartition(self.topic, partition)
        timeout = self.settings.connect_timeout_s
        try:
            futures = self._admin().list_offsets({tp: OffsetSpec.latest()},
                                                 isolation_level=IsolationLevel.READ_UNCOMMITTED,
                                                 request_timeout=timeout)
            return int(futures[tp].result(timeout=timeout).offset)
        except KafkaException as exc:
            if missing_ok and exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise TransientError(f"cannot list the offsets of {self.topic}[{partition}]: {exc}") from None

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
        if missing_ok and self._partitions is None and self._end(0, missing_ok) is None:
            return None  # no offsets topic
        partition = self.partition(lease_id)
        end = self._end(partition, missing_ok=False)
        if not end:
            return None
        key, where = lease_id.encode(), f"{self.topic}[{partition}]"
        consumer = Consumer({**self.settings.kafka_client_config(),
                             "group.id": f"outbox-relay-offsets-{uuid.uuid4().hex[:8]}",
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             "enable.partition.eof": True, "logger": logging.getLogger("kafka.consumer")})
        newest: tuple[int, bytes | None] | None = None
        limit = self.settings.transaction_timeout_ms / 1000 + 30
        deadline = time.monotonic() + limit
        try:
            consumer.assign([TopicPartition(self.topic, partition, OFFSET_BEGINNING)])
            while True:
                heartbeat()
                msg = consumer.poll(_WAIT_SLICE_S)
                if msg is not None and msg.error() is None:
                    if msg.key() == key:
                        newest = (msg.offset(), msg.value())
                    if msg.offset() + 1 >= end:
                        break
                elif msg is not None and msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= end:
                    break
                if time.monotonic() > deadline:
                    raise TransientError(
                        f"could not read {where} ({env_name('offsets_topic')}) with read_committed to offset "
                        f"{end} within {limit:.0f}s: an open transaction holds its last stable offset back")
        finally:
            consumer.close()
        if newest is None or newest[1] is None:
            return None
        return OffsetsRecord.decode(lease_id, newest[1], f"{where}@{newest[0]}")

    def after_exactly_once(self, lease_id: str, fingerprint: str) -> Callable[[Any, Grant, Heartbeat], Checkpoint]:
        """The resume hook of at-least-once mode (relay.offsets.after_exactly_once): reads this
        topic only when the lease's checkpoint was stored in exactly-once mode."""
        def resume(_publisher: Any, grant: Grant, heartbeat: Heartbeat) -> Checkpoint:
            chosen = after_exactly_once(grant.checkpoint, lambda: self.read(lease_id, heartbeat, missing_ok=True),
                                        fingerprint, self.topic)
            _log_choice(grant.checkpoint, chosen, self.topic)
            return chosen
        return resume


def _log_choice(checkpoint: Checkpoint, chosen: Checkpoint, topic: str) -> None:
    if chosen is not checkpoint:
        log.info("resuming after %s from %s, newer than the MongoDB checkpoint %s (it was not written after "
                 "the last Kafka commit)", short_token(chosen.token), topic, short_token(checkpoint.token))


# ---- the transactional producer ---------------------------------------------------------------

class TransactionalPublisher:
    """One transactional producer for one lease (relay.boundaries.Publisher); a delivery is one
    transaction. `resume_point()` must be called once before `send()`."""

    def __init__(self, settings: Settings, lease_id: str, offsets: OffsetsTopic, fingerprint: str) -> None:
        self._settings = settings
        self._lease_id = lease_id
        self._offsets = offsets
        self._fingerprint = fingerprint
        self._key = lease_id.encode()
        self._grant: Grant | None = None
        self._partition = 0
        self._in_transaction = False
        self._unusable = False  # after a fatal error: no abort, no further call
        self._current = "?"  # the event being handed to produce() (names a refusal by produce itself)
        config = {**transactional_config(settings, lease_id), "error_cb": self._on_error,
                  "logger": logging.getLogger("kafka.producer")}
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise _config_error(exc) from None

    def _on_error(self, err: KafkaError) -> None:
        important = err.fatal() or err.code() == KafkaError._ALL_BROKERS_DOWN
        log.log(logging.WARNING if important else logging.DEBUG, "kafka client: %s", err)

    # ---- a new leading session -------------------------------------------------------------

    def resume_point(self, grant: Grant, heartbeat: Heartbeat) -> Checkpoint:
        """Fence every earlier producer of the lease, then return where to resume: after the newer
        of the lease document's checkpoint and the offsets topic's newest committed record.

        With no MongoDB checkpoint (first start, `checkpoint reset`) the relay starts at
        RELAY_START_AT; a record left in the offsets topic from before is then forgotten (a
        tombstone, in a transaction) so that it can never be taken for this lineage's position.
        """
        self._init_transactions(heartbeat)
        self._grant = grant
        self._partition = self._offsets.partition(self._lease_id)
        record = self._offsets.read(self._lease_id, heartbeat)
        checkpoint = grant.checkpoint
        if forgets_record(checkpoint, record):
            assert record is not None
            log.warning("no MongoDB checkpoint for %s, but %s holds token %s: forgetting it (starting at "
                        "RELAY_START_AT=%s)", self._lease_id, self._offsets.topic, short_token(record.token),
                        self._settings.start_at)
            self._run_transaction(lambda: self._produce_record(None), heartbeat, None)
        chosen = resume_point(checkpoint, record, self._fingerprint, self._offsets.topic)
        _log_choice(checkpoint, chosen, self._offsets.topic)
        return chosen

    def _init_transactions(self, heartbeat: Heartbeat) -> None:
        limit = max(self._settings.connect_timeout_s, 30.0)
        deadline = time.monotonic() + limit
        while True:
            try:
                self._producer.init_transactions(_WAIT_SLICE_S * 2)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                    self._unusable = True
                    raise ConfigError(kafka_env_name("transaction.timeout.ms"),
                                      f"{self._settings.transaction_timeout_ms} ms is more than the broker allows "
                                      "(transaction.max.timeout.ms); lower it, or RELAY_KAFKA_MESSAGE_TIMEOUT_MS "
                                      "which it follows by default") from None
                if err.fatal():
                    self._unusable = True
                    raise ProducerFatalError(f"init_transactions failed: {err}") from None
                if not err.retriable() or time.monotonic() > deadline:
                    raise TransientError(
                        f"init_transactions for {transactional_id(self._lease_id)} did not complete within "
                        f"{limit:.0f}s ({err}); the broker must support transactions "
                        "(transaction.state.log.replication.factor and min.isr at most the brokers there are)"
                    ) from None
                heartbeat()

    # ---- relay.boundaries.Publisher -----------------------------------------------------------

    def send(self, delivery: Delivery, while_waiting: Heartbeat) -> None:
        """Publish the delivery in one transaction with its offsets record; return once committed.

        Raises (nothing of the transaction is then visible to read_committed consumers):
        ProducerFencedError, ProducerFatalError, TransactionAbortedError, or the delivery's own
        failure (relay.publisher.delivery_failure: a refused record batch, a poison event, a
        failed delivery).
        """
        assert self._grant is not None, "resume_point() first"
        token = delivery.token

        def produce_all() -> None:
            produce, on_delivery, poll = self._producer.produce, delivery.on_delivery, self._producer.poll
            for m in delivery.messages:
                self._current = m.event_id
                while True:
                    try:
                        produce(m.topic, m.value, m.key, headers=m.headers, on_delivery=on_delivery)
                        break
                    except BufferError:  # local queue full: serve reports, then retry
                        poll(_WAIT_SLICE_S)
                        while_waiting()
            self._current = "?"
            if token is not None:
                self._produce_record(OffsetsRecord(self._lease_id, token, self._fingerprint,
                                                   self._grant.fencing_token, self._grant.owner).encode())

        self._run_transaction(produce_all, while_waiting, delivery)
        # commit_transaction served every report (all successful: it committed); a safety net:
        deadline = time.monotonic() + self._settings.connect_timeout_s
        while not delivery.done:
            if time.monotonic() > deadline:
                raise DeliveryError("?", "committed, but not every delivery report came back")
            self._producer.poll(0.1)

    def _produce_record(self, value: bytes | None) -> None:
        self._producer.produce(self._offsets.topic, value, self._key, partition=self._partition)

    def _run_transaction(self, produce: Callable[[], None], while_waiting: Heartbeat,
                         delivery: Delivery | None) -> None:
        try:
            self._producer.begin_transaction()
            self._in_transaction = True
            produce()
            self._commit(while_waiting)
        except KafkaException as exc:
            raise self._failed(exc.args[0] if exc.args else None, delivery, while_waiting) from exc

    def _commit(self, while_waiting: Heartbeat) -> None:
        while True:
            try:
                self._producer.commit_transaction(_WAIT_SLICE_S)
                self._in_transaction = False
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.retriable() and not err.fatal() and not err.txn_requires_abort():
                    while_waiting()  # still committing (flushing); delivery timeouts bound this
                    continue
                raise

    def _failed(self, err: KafkaError | None, delivery: Delivery | None, while_waiting: Heartbeat) -> Exception:
        """The error a failed transaction is reported as, after aborting it where that is possible."""
        if err is not None and err.fatal():
            self._unusable = True
            if kafka_fenced(err):
                return ProducerFencedError(
                    f"the broker fenced the transactional producer {transactional_id(self._lease_id)}: a newer "
                    f"leader initialized it, so fencing token {self._grant.fencing_token if self._grant else '?'} "
                    f"may commit nothing more ({err.str()})")
            return ProducerFatalError(f"transactional producer unusable: {err}")
        try:
            self._abort(while_waiting)
        except KafkaException as exc:
            abort_err = exc.args[0] if exc.args else None
            if kafka_fenced(abort_err):
                self._unusable = True
                return ProducerFencedError(f"fenced while aborting a transaction: {abort_err}")
            self._unusable = True
            return ProducerFatalError(f"could not abort the failed transaction ({abort_err}); the next producer "
                                      f"of this lease aborts it when it starts. The failure: {err}")
        if delivery is not None and delivery.failure is not None:
            return delivery_failure(delivery)  # the first failed report decides, as without transactions
        if err is not None and not err.txn_requires_abort() and not err.retriable():
            return _produce_error(KafkaException(err), self._current)  # refused by produce() itself
        return TransactionAbortedError(f"transaction aborted, none of it visible: {err}")

    def _abort(self, while_waiting: Heartbeat) -> None:
        if not self._in_transaction:
            return
        deadline = time.monotonic() + self._settings.transaction_timeout_ms / 1000
        while True:
            try:
                self._producer.abort_transaction(_WAIT_SLICE_S)
                self._in_transaction = False
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.retriable() and not err.fatal() and time.monotonic() < deadline:
                    while_waiting()
                    continue
                raise

    def poll(self, timeout: float) -> None:
        try:
            self._producer.poll(timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if kafka_fenced(err):
                raise ProducerFencedError(f"transactional producer fenced: {err}") from exc
            raise DeliveryError("?", err) from exc

    def failure(self, delivery: Delivery) -> Exception:
        return delivery_failure(delivery)

    @property
    def queued(self) -> int:
        return len(self._producer)

    def close(self) -> None:
        """Abort a transaction left open (best effort: the next leader's `init_transactions` aborts
        it anyway, or the broker after `transaction.timeout.ms`), drop anything queued."""
        if self._in_transaction and not self._unusable:
            try:
                self._producer.abort_transaction(2.0)
            except KafkaException as exc:
                log.debug("could not abort the open transaction on close: %s", exc)
        self._in_transaction = False
        try:
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.flush(0)
        except KafkaException:
            pass

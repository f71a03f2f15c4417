"""Exactly-once into Kafka (RELAY_DELIVERY=exactly-once): one Kafka transaction per delivery.

`TransactionalPublisher` implements the loop's Publisher boundary (relay.core.boundaries) with a
transactional producer (`transactional.id` = `outbox-relay:<lease id>`, relay.kafka.offsets_record). For each
delivery `send()` runs one transaction: begin, produce the delivery's messages and one record to
the compacted offsets topic (RELAY_OFFSETS_TOPIC, key = the lease id, value = the token covering
the delivery: relay.kafka.offsets_record.OffsetsRecord), commit. It returns only once the commit succeeded, so
a delivery the loop sees acknowledged is visible to read_committed consumers, and the MongoDB
checkpoint (written by the loop right after) never covers an event that is not. One transaction is
in flight at a time (RELAY_PIPELINE_DEPTH must be 1), bounded by RELAY_BATCH_MAX_EVENTS and
RELAY_BATCH_MAX_BYTES like any delivery.

A new leading session first calls `resume_point()`: `init_transactions` fences every earlier
producer of the lease (a zombie's open transaction is aborted, its later commits fail with a fenced
error and it goes back to standby), then the offsets topic is read with read_committed to its end,
and the leader resumes after the newer of that record and the MongoDB checkpoint
(relay.core.resume.resume_point). The order matters: read before fencing, and a zombie could commit
after the read. The produce loop is the one every relay producer shares (relay.kafka.producer).

Errors, translated here for the one classifier (relay.core.errors.classify):
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
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from relay.core.config import WAIT_SLICE_S
from relay.core.errors import (
    ConfigError,
    DeliveryError,
    ProducerFatalError,
    ProducerFencedError,
    TransactionAbortedError,
    TransientError,
    kafka_env_name,
)
from relay.core.positions import Checkpoint, Grant, short_token
from relay.core.resume import forgets_record, resume_point
from relay.core.window import Delivery
from relay.kafka.config import KafkaConfig
from relay.kafka.errors import authorization_error, config_error, fenced, produce_error
from relay.kafka.offsets_record import OffsetsRecord, transactional_id
from relay.kafka.offsets_topic import OffsetsTopic
from relay.kafka.producer import ProducerBase, delivery_failure

log = logging.getLogger(__name__)

Heartbeat = Callable[[], None]


def transactional_config(config: KafkaConfig, lease_id: str) -> dict[str, Any]:
    """The producer configuration of exactly-once mode: the relay's (idempotence, acks=all forced)
    plus the lease's transactional.id and a transaction timeout no shorter than the delivery
    timeout (librdkafka refuses otherwise)."""
    return {
        **config.producer_config(),
        "transactional.id": transactional_id(lease_id),
        "transaction.timeout.ms": str(config.transaction_timeout_ms),
    }


def check_transactional_config(config: KafkaConfig, lease_id: str) -> None:
    """Raise ConfigError naming the property if librdkafka refuses the transactional configuration
    (building the producer contacts no broker; `init_transactions` would)."""
    try:
        Producer(transactional_config(config, lease_id))
    except KafkaException as exc:
        raise config_error(exc) from exc


def log_choice(checkpoint: Checkpoint, chosen: Checkpoint, topic: str) -> None:
    """Say so when a leader resumes from the offsets topic rather than the MongoDB checkpoint."""
    if chosen is not checkpoint:
        log.info(
            "resuming after %s from %s, newer than the MongoDB checkpoint %s (it was not written after "
            "the last Kafka commit)",
            short_token(chosen.token),
            topic,
            short_token(checkpoint.token),
        )


class TransactionalPublisher(ProducerBase):
    """One transactional producer for one lease (relay.core.boundaries.Publisher); a delivery is
    one transaction. `resume_point()` must be called once before `send()`."""

    def __init__(
        self, config: KafkaConfig, lease_id: str, offsets: OffsetsTopic, fingerprint: str, start_at: str = "oplog-start"
    ) -> None:
        super().__init__(transactional_config(config, lease_id))
        self._config = config
        self._lease_id = lease_id
        self._offsets = offsets
        self._fingerprint = fingerprint
        self._start_at = start_at  # RELAY_START_AT, named when an old record is forgotten
        self._key = lease_id.encode()
        self._grant: Grant | None = None
        self._partition = 0
        self._in_transaction = False
        self._unusable = False  # after a fatal error: no abort, no further call

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
            log.warning(
                "no MongoDB checkpoint for %s, but %s holds token %s: forgetting it (starting at RELAY_START_AT=%s)",
                self._lease_id,
                self._offsets.topic,
                short_token(record.token),
                self._start_at,
            )
            self._run_transaction(lambda: self._produce_record(None), heartbeat, None)
        chosen = resume_point(checkpoint, record, self._fingerprint, self._offsets.topic)
        log_choice(checkpoint, chosen, self._offsets.topic)
        return chosen

    def _init_transactions(self, heartbeat: Heartbeat) -> None:
        limit = max(self._config.connect_timeout_s, 30.0)
        deadline = time.monotonic() + limit
        while True:
            try:
                self._producer.init_transactions(WAIT_SLICE_S * 2)
                return
            except KafkaException as exc:
                err = exc.args[0]
                denied = authorization_error(err, transactional_id(self._lease_id))
                if denied is not None:
                    self._unusable = True
                    raise denied from exc
                if err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                    self._unusable = True
                    raise ConfigError(
                        kafka_env_name("transaction.timeout.ms"),
                        f"{self._config.transaction_timeout_ms} ms is more than the broker allows "
                        "(transaction.max.timeout.ms); lower it, or RELAY_KAFKA_MESSAGE_TIMEOUT_MS "
                        "which it follows by default",
                    ) from exc
                if err.fatal():
                    self._unusable = True
                    raise ProducerFatalError(f"init_transactions failed: {err}") from exc
                if not err.retriable() or time.monotonic() > deadline:
                    raise TransientError(
                        f"init_transactions for {transactional_id(self._lease_id)} did not complete within "
                        f"{limit:.0f}s ({err}); the broker must support transactions "
                        "(transaction.state.log.replication.factor and min.isr at most the brokers there are)"
                    ) from exc
                heartbeat()

    # ---- relay.core.boundaries.Publisher -----------------------------------------------------------

    def send(self, delivery: Delivery, while_waiting: Heartbeat) -> None:
        """Publish the delivery in one transaction with its offsets record; return once committed.

        Raises (nothing of the transaction is then visible to read_committed consumers):
        ProducerFencedError, ProducerFatalError, TransactionAbortedError, or the delivery's own
        failure (relay.kafka.producer.delivery_failure: a refused record batch, a poison event, a
        failed delivery).
        """
        grant = self._grant
        assert grant is not None, "resume_point() first"
        token = delivery.token

        def produce_all() -> None:
            self._produce_all(delivery, while_waiting)
            if token is not None:
                self._produce_record(
                    OffsetsRecord(self._lease_id, token, self._fingerprint, grant.fencing_token, grant.owner).encode()
                )

        self._run_transaction(produce_all, while_waiting, delivery)
        # commit_transaction served every report (all successful: it committed); a safety net:
        deadline = time.monotonic() + self._config.connect_timeout_s
        while not delivery.done:
            if time.monotonic() > deadline:
                raise DeliveryError("?", "committed, but not every delivery report came back")
            self._producer.poll(0.1)

    def _produce_record(self, value: bytes | None) -> None:
        self._producer.produce(self._offsets.topic, value, self._key, partition=self._partition)

    def _run_transaction(
        self, produce: Callable[[], None], while_waiting: Heartbeat, delivery: Delivery | None
    ) -> None:
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
                self._producer.commit_transaction(WAIT_SLICE_S)
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
            if fenced(err):
                return ProducerFencedError(
                    f"the broker fenced the transactional producer {transactional_id(self._lease_id)}: a newer "
                    f"leader initialized it, so fencing token {self._grant.fencing_token if self._grant else '?'} "
                    f"may commit nothing more ({err.str()})"
                )
            return ProducerFatalError(f"transactional producer unusable: {err}")
        try:
            self._abort(while_waiting)
        except KafkaException as exc:
            abort_err = exc.args[0] if exc.args else None
            if fenced(abort_err):
                self._unusable = True
                return ProducerFencedError(f"fenced while aborting a transaction: {abort_err}")
            self._unusable = True
            return ProducerFatalError(
                f"could not abort the failed transaction ({abort_err}); the next producer "
                f"of this lease aborts it when it starts. The failure: {err}"
            )
        if delivery is not None and delivery.failure is not None:
            return delivery_failure(delivery)  # the first failed report decides, as without transactions
        if err is not None and not err.txn_requires_abort() and not err.retriable():
            return produce_error(KafkaException(err), self._current)  # refused by produce() itself
        return TransactionAbortedError(f"transaction aborted, none of it visible: {err}")

    def _abort(self, while_waiting: Heartbeat) -> None:
        if not self._in_transaction:
            return
        deadline = time.monotonic() + self._config.transaction_timeout_ms / 1000
        while True:
            try:
                self._producer.abort_transaction(WAIT_SLICE_S)
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
            if fenced(err):
                raise ProducerFencedError(f"transactional producer fenced: {err}") from exc
            raise DeliveryError("?", err) from exc

    def drain(self, timeout: float) -> None:
        """`send` returned with its transaction committed (commit_transaction flushes): nothing
        is held back, so this is `poll`."""
        self.poll(timeout)

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

"""Exactly-once into Kafka (RELAY_DELIVERY=exactly-once): Kafka transactions spanning several reads.

`TransactionalPublisher` implements the loop's Publisher boundary (relay.core.boundaries) with a
transactional producer (`transactional.id` = `outbox-relay:<lease id>`, relay.kafka.offsets_record).
`send()` adds a parcel (a read, or a part of one) to the open transaction, beginning one when
none is open. The transaction commits once it holds RELAY_TRANSACTION_MAX_EVENTS events or
RELAY_TRANSACTION_MAX_BYTES bytes, or was begun RELAY_TRANSACTION_MAX_MS ago (checked by `send` and
`poll`), or when the loop waits for every parcel (`drain`: an idle stream, a stop, a read that
would keep the transaction waiting). Before the commit, one record to the compacted offsets topic
(RELAY_OFFSETS_TOPIC, key = the lease id, value = the newest token of the transaction:
relay.kafka.offsets_record.OffsetsRecord). The commit runs on a thread of its own
(relay.kafka.committer; a fixed wait of ~18 ms, docs/exactly-once.md#cost) while the loop reads and
encodes the next parcels; those wait, held and not produced yet, and begin the next transaction
once the commit ended (one transaction at a time, as the producer allows; RELAY_PIPELINE_DEPTH
must be 1).

Invariant: a parcel is acknowledged (every report in, no failure) only after the commit of the
transaction holding it, which also wrote the offsets record of its newest token. Each parcel is
held (relay.core.window.Parcel.hold) from `send` until its transaction ended, and released on the
loop's thread only (`_finish_commit`, once the committer's Future is done; `_failed`), so a parcel
the loop sees acknowledged is visible to read_committed consumers, and the MongoDB checkpoint
(handed over by the loop right after, relay.core.coalescer) never covers an event that is not.

Who owns what (two threads: the loop's, which calls every method here, and the commit thread):
- the loop's thread alone writes every field of `TransactionalPublisher`, of its open transaction
  and of the parcels waiting for its commit (relay.kafka.open_transaction); the commit thread
  reads none of them;
- what both threads touch is the `Committer` (relay.kafka.committer), its rule beside each field:
  the producer is the commit thread's from `Committer.start` until `Committer.take` and the loop's
  otherwise (every producer call here runs while the committer is not `busy`; `queued`, read
  by the metrics' scrape on its own thread, only reads librdkafka's thread-safe queue count), and
  the commit's Future hands its outcome over; the reports commit_transaction serves count the
  committing parcels' reports on the commit thread, and the loop releases those parcels after
  `Committer.take`;
- parcels wait (`_waiting`) only while a commit is in flight, and the open transaction is left as
  it is meanwhile: a parcel handed over then is produced once the loop took the commit's outcome.

A new leading session first calls `fence()`: `init_transactions` fences every earlier producer of
the lease (a zombie's open transaction is aborted, its later commits fail with a fenced error and
it goes back to standby). Only then is the offsets topic read, read_committed to its end, for the
resume decision (relay.kafka.modes, relay.core.resume): were it read before the fence, a zombie
could commit after the read. When that decision says so, `forget_record()` writes a tombstone for
the lease's record, in a transaction of its own. The produce loop is the one every relay producer
shares (relay.kafka.producer).

Errors, translated by relay.kafka.errors.translate (one table of codes) for the one classifier
(relay.core.errors.classify), this module saying what the producer was doing (`_attempt`):
- fenced (`_FENCED`, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH): ProducerFencedError -> standby;
- a refused ACL: PermissionDeniedError naming the transactional id or the topics -> stop;
- abortable (`txn_requires_abort()`): the transaction is aborted, then the parcel's failed
  report decides as for the idempotent producer (a refused record batch is replayed one message
  per transaction to name the poison event), else TransactionAbortedError -> restart;
- fatal: ProducerFatalError -> restart with a new producer (which fences this one);
- retriable timeouts of commit/abort/init: retried in slices (relay.core.retry), the loop serving
  the lease heartbeat meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from relay.core.config import WAIT_SLICE_S
from relay.core.errors import (
    BatchRefusedError,
    DeliveryError,
    ProducerFatalError,
    TransactionAbortedError,
    TransientError,
)
from relay.core.positions import Grant
from relay.core.retry import retrying
from relay.core.window import Parcel
from relay.kafka.committer import Committer, still_working
from relay.kafka.config import KafkaConfig
from relay.kafka.errors import Attempt, Treat, config_error, fenced, kafka_error, translate, treatment
from relay.kafka.offsets_record import OffsetsRecord, transactional_id
from relay.kafka.offsets_topic import OffsetsTopic
from relay.kafka.open_transaction import OpenTransaction, WaitingParcels
from relay.kafka.producer import LibrdkafkaProducer, ProduceRefused, parcel_failure

log = logging.getLogger(__name__)

Heartbeat = Callable[[], None]
CLOSE_WAIT_S = 2.0  # the longest close() waits for a commit in flight, and for an abort


def _nothing() -> None:
    pass


def transactional_config(config: KafkaConfig, lease_id: str) -> dict[str, Any]:
    """The producer configuration of exactly-once mode: the relay's (idempotence, acks=all forced)
    plus the lease's transactional.id and a transaction timeout no shorter than the parcel
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


def _serving(heartbeat: Heartbeat) -> Callable[[BaseException, float], None]:
    """A retry's hook between attempts that serves the lease heartbeat."""

    def serve(_error: BaseException, _wait_s: float) -> None:
        heartbeat()

    return serve


def aborted_failure(parcels: list[Parcel]) -> Exception | None:
    """The error an aborted transaction's first failed report stands for (as without
    transactions: relay.kafka.producer.parcel_failure), or None when no report failed.

    A refused record batch is replayed one message per transaction from where the aborted
    transaction began (the checkpoint), so every event up to the refused batch is isolated."""
    failed = next((i for i, d in enumerate(parcels) if d.failure is not None), None)
    if failed is None:
        return None
    refusal = parcel_failure(parcels[failed])
    if isinstance(refusal, BatchRefusedError):
        return BatchRefusedError(str(refusal), sum(len(d.messages) for d in parcels[: failed + 1]))
    return refusal


class TransactionalPublisher(LibrdkafkaProducer):
    """One transactional producer for one lease (relay.core.boundaries.Publisher); a transaction
    spans parcels (reads) until RELAY_TRANSACTION_MAX_EVENTS / _BYTES / _MS says to commit, or
    the loop waits for everything (`drain`). `fence()` must be called once before `send()`.
    The invariant and who owns which field: the module docstring."""

    def __init__(self, config: KafkaConfig, lease_id: str, offsets: OffsetsTopic, fingerprint: str) -> None:
        super().__init__(transactional_config(config, lease_id))
        self._config = config
        self._lease_id = lease_id
        self._offsets = offsets
        self._fingerprint = fingerprint
        self._key = lease_id.encode()
        self._grant: Grant | None = None
        self._record_partition = 0  # the offsets topic's partition of this lease's records
        self._unusable = False  # after a fatal error: no abort, no further call
        self._while_waiting: Heartbeat = _nothing  # the heartbeat of the last `send`, for `poll` and `drain`
        self._open = OpenTransaction()
        self._waiting = WaitingParcels()
        self._committer = Committer(self._producer, config.connect_timeout_s)

    # ---- a new leading session -------------------------------------------------------------

    def fence(self, grant: Grant, heartbeat: Heartbeat) -> None:
        """Fence every earlier producer of the lease (`init_transactions`: a zombie's open
        transaction is aborted and it can commit nothing more), for the session of `grant`."""
        self._init_transactions(heartbeat)
        self._grant = grant
        self._record_partition = self._offsets.record_partition(self._lease_id)

    def forget_record(self, heartbeat: Heartbeat) -> None:
        """Tombstone the lease's offsets record, in a transaction of its own, so that a record from
        before a `checkpoint reset` can never be taken for this lineage's checkpoint (asked by the
        resume decision, relay.core.resume, after `fence()`, before any `send`)."""
        assert self._grant is not None, "fence() first"
        assert not self._open.parcels, "before any send"
        try:
            self._begin(time.monotonic())
            self._produce_record(None)
        except KafkaException as exc:
            raise self._failed(kafka_error(exc), heartbeat) from exc
        self._committer.start()
        self._commit_everything(heartbeat)

    def _init_transactions(self, heartbeat: Heartbeat) -> None:
        """`init_transactions`, retried while the broker answers with a retriable error (a
        coordinator not ready yet), serving the lease heartbeat, for at most the connect timeout
        (30 s at least)."""
        limit = max(self._config.connect_timeout_s, 30.0)
        attempt = self._attempt("initialize transactions")

        def not_ready(exc: BaseException) -> bool:
            err = kafka_error(exc)
            return err is not None and err.retriable() and isinstance(translate(err, attempt), DeliveryError)

        try:
            retrying(not_ready, give_up_after_s=limit, before_wait=_serving(heartbeat))(
                self._producer.init_transactions, WAIT_SLICE_S * 2
            )
        except KafkaException as exc:
            err = kafka_error(exc)
            failure = translate(err, attempt)
            if not isinstance(failure, DeliveryError):  # refused, fenced, a setting, fatal
                self._unusable = True
                raise failure from exc
            raise TransientError(
                f"init_transactions for {transactional_id(self._lease_id)} did not complete within "
                f"{limit:.0f}s ({err}); the broker must support transactions "
                "(transaction.state.log.replication.factor and min.isr at most the brokers there are)"
            ) from exc

    def _attempt(self, step: str, event_id: str = "?", transaction: OpenTransaction | None = None) -> Attempt:
        """What this producer does in `step`, for relay.kafka.errors.translate: WRITE and DESCRIBE
        on its transactional id, and on the topics of `transaction` (the open one unless given)
        and the offsets topic."""
        names = ", ".join([*(transaction or self._open).topics(), self._offsets.topic])
        needs = (
            ("TRANSACTIONAL_ID", transactional_id(self._lease_id), "WRITE, DESCRIBE"),
            ("TOPIC", names, "WRITE, DESCRIBE"),
        )
        return Attempt(step, needs, event_id)

    # ---- relay.core.boundaries.Publisher -----------------------------------------------------------

    def send(self, parcel: Parcel, while_waiting: Heartbeat) -> None:
        """Add the parcel to the open transaction (beginning one when none is open), and start
        that transaction's commit once it holds RELAY_TRANSACTION_MAX_EVENTS events or
        RELAY_TRANSACTION_MAX_BYTES bytes, or was begun RELAY_TRANSACTION_MAX_MS ago. While a
        commit is in flight the parcel waits, held and not produced yet, and begins the next
        transaction once that commit ended (`_advance`): the loop reads and encodes meanwhile.

        The parcel is held (relay.core.window.Parcel.hold) until its transaction ends: the loop
        sees it acknowledged only once the transaction committed, with the offsets record of its
        newest token, so neither position ever covers an event read_committed consumers cannot see.

        Raises (nothing of the failed transaction, nor of the parcels waiting for it, is then
        visible to read_committed consumers): ProducerFencedError, ProducerFatalError,
        TransactionAbortedError, or the first failed report's own failure
        (relay.kafka.producer.parcel_failure: a refused record batch, a poison event, a failed
        delivery). `poll` and `drain` raise the same, for the parcels they produce or commit.
        """
        assert self._grant is not None, "fence() first"
        self._while_waiting = while_waiting
        parcel.hold()
        self._waiting.add(parcel, time.monotonic())
        self._advance(while_waiting)

    def due_in(self) -> float | None:
        """Both meanings of relay.core.boundaries.Publisher.due_in: with no commit in flight, the
        open transaction's time bound; with one, how long the parcels waiting for it may still wait."""
        max_s, now = self._config.transaction_max_ms / 1000, time.monotonic()
        if self._committer.busy:
            return self._waiting.due_in(max_s, now)
        return self._open.due_in(max_s, now)

    def _advance(self, while_waiting: Heartbeat) -> None:
        """Move on as far as possible without waiting: end a commit that finished, then produce
        the parcels that waited for it into the next transaction (starting its commit when a
        bound is reached; the rest wait for that one), then start a commit that is due."""
        if self._committer.busy:
            if not self._committer.ended:
                return
            self._finish_commit(while_waiting)
        while self._waiting and not self._committer.busy:
            self._add(self._waiting.pop(), while_waiting)
        due = self.due_in()
        if not self._committer.busy and due is not None and due <= 0:
            self._start_commit(while_waiting)

    def _add(self, parcel: Parcel, while_waiting: Heartbeat) -> None:
        """Produce the parcel into the open transaction (begun here when none is); start the
        commit when the transaction reached RELAY_TRANSACTION_MAX_EVENTS or _BYTES."""
        assert not self._committer.busy, "the committer holds the producer"
        self._open.add(parcel)
        try:
            if not self._open.begun:
                self._begin(self._waiting.since)  # its time bound counts its parcels' wait
            self._produce_all(parcel, while_waiting)
        except ProduceRefused as exc:
            raise self._failed(kafka_error(exc.cause), while_waiting, exc.event_id) from exc
        except KafkaException as exc:
            raise self._failed(kafka_error(exc), while_waiting) from exc
        if self._open.full(self._config.transaction_max_events, self._config.transaction_max_bytes):
            self._start_commit(while_waiting)

    def _begin(self, at: float) -> None:
        self._producer.begin_transaction()
        self._open.begin(at)

    def _start_commit(self, while_waiting: Heartbeat) -> None:
        """Write the offsets record of the transaction's newest token, then hand its commit to the
        commit thread (`_finish_commit` releases its parcels once it ended)."""
        grant = self._grant
        assert grant is not None
        token = self._open.newest_token()
        try:
            if token is not None:
                self._produce_record(
                    OffsetsRecord(self._lease_id, token, self._fingerprint, grant.fencing_token, grant.owner).encode()
                )
        except KafkaException as exc:
            raise self._failed(kafka_error(exc), while_waiting) from exc
        self._committer.start()

    def _finish_commit(self, while_waiting: Heartbeat) -> None:
        """The commit in flight ended: release its parcels, acknowledged (every report in: the
        committer served them), or raise its failure (`_failed`)."""
        try:
            self._committer.take()
        except KafkaException as exc:
            raise self._failed(kafka_error(exc), while_waiting) from exc
        committed, self._open = self._open, OpenTransaction()
        if any(d.pending > 1 for d in committed.parcels):  # a safety net: the commit serves every report
            raise DeliveryError("?", "committed, but not every delivery report came back")
        for d in committed.parcels:
            d.release()

    def _await_commit(self, timeout: float) -> None:
        """Wait up to `timeout` for the commit in flight, then move on (`_advance`)."""
        self._committer.wait(timeout)
        self._advance(self._while_waiting)

    def _commit_everything(self, heartbeat: Heartbeat) -> None:
        """Until nothing is open, in flight or waiting: start the open transaction's commit when
        none is in flight, wait for it a slice at a time, serving `heartbeat` between slices."""
        while self._committer.busy or self._open.parcels:
            if not self._committer.busy:
                self._start_commit(heartbeat)
            self._committer.wait(WAIT_SLICE_S)
            self._advance(heartbeat)
            if self._committer.busy:
                heartbeat()

    def _produce_record(self, value: bytes | None) -> None:
        assert not self._committer.busy, "the committer holds the producer"
        self._producer.produce(self._offsets.topic, value, self._key, partition=self._record_partition)

    def _failed(self, err: KafkaError | None, while_waiting: Heartbeat, event_id: str = "?") -> Exception:
        """The error a failed transaction is reported as, after aborting it where that is possible;
        every parcel it held, and every one waiting for it, is released as failed (none of it is
        visible)."""
        assert not self._committer.busy, "the commit thread has ended"
        failed, self._open = self._open, OpenTransaction()
        parcels = [*failed.parcels, *self._waiting.take_all()]
        try:
            return self._failure(err, failed, parcels, while_waiting, event_id)
        finally:
            stand_in = (b"", err if err is not None else KafkaError(KafkaError._PURGE_QUEUE, "transaction aborted"))
            for d in parcels:
                d.release(stand_in)

    def _failure(
        self,
        err: KafkaError | None,
        failed: OpenTransaction,
        parcels: list[Parcel],
        while_waiting: Heartbeat,
        event_id: str,
    ) -> Exception:
        """The error for the `failed` transaction (`parcels`: its own and those waiting for it),
        after aborting it if the producer began it."""
        if err is not None and err.fatal():
            self._unusable = True
            return translate(err, self._attempt("run a transaction", transaction=failed))  # fenced, or unusable
        try:
            if failed.begun:
                self._abort(while_waiting)
        except KafkaException as exc:
            abort_err = kafka_error(exc)
            self._unusable = True
            if fenced(abort_err):
                return translate(abort_err, self._attempt("abort a transaction", transaction=failed))
            return ProducerFatalError(
                f"could not abort the failed transaction ({abort_err}); the next producer "
                f"of this lease aborts it when it starts. The failure: {err}"
            )
        refusal = aborted_failure(parcels)
        if refusal is not None:
            return refusal
        if err is not None and not err.txn_requires_abort() and not err.retriable():
            return translate(err, self._attempt("produce", event_id, failed))  # refused by produce() itself
        if treatment(err) is Treat.DENIED:  # a refused ACL (the offsets topic's, say), aborted first
            return translate(err, self._attempt("run a transaction", transaction=failed))
        return TransactionAbortedError(f"transaction aborted, none of it visible: {err}")

    def _abort(self, while_waiting: Heartbeat) -> None:
        """`abort_transaction`, retried while the broker answers with a retriable error, serving
        the lease heartbeat, for at most the transaction timeout (the broker aborts it then)."""
        limit = self._config.transaction_timeout_ms / 1000
        retrying(still_working(abortable=True), give_up_after_s=limit, before_wait=_serving(while_waiting))(
            self._producer.abort_transaction, WAIT_SLICE_S
        )

    def poll(self, timeout: float) -> None:
        """Serve reports, waiting up to `timeout` but not past the open transaction's time bound,
        then start that transaction's commit if it is due; while a commit is in flight, wait up
        to `timeout` for it instead, then produce what waited for it."""
        if self._committer.busy:
            self._await_commit(timeout)
            return
        due = self.due_in()
        try:
            self._producer.poll(timeout if due is None else max(0.0, min(timeout, due)))
        except KafkaException as exc:
            err = kafka_error(exc)
            if self._open.parcels:
                raise self._failed(err, self._while_waiting) from exc
            raise translate(err, self._attempt("poll")) from exc
        self._advance(self._while_waiting)

    def drain(self, timeout: float) -> None:
        """The loop waits for every parcel: commit everything now (the commit in flight, the
        parcels waiting for it, the open transaction; commit_transaction flushes what linger.ms
        holds back), serving the heartbeat every slice, then serve what is due."""
        self._commit_everything(self._while_waiting)
        self.poll(0)

    def close(self) -> None:
        """Stop a commit in flight from retrying and wait for it briefly, abort a transaction left
        open (best effort: the next leader's `init_transactions` aborts it anyway, or the broker
        after `transaction.timeout.ms`), drop anything queued. A commit that still lands is
        safe: the offsets record it carries is where the next leader resumes. A commit still
        running after the wait keeps the producer (the commit thread ends at its next attempt)."""
        busy = self._committer.busy
        if not self._committer.close(CLOSE_WAIT_S):
            log.debug("a commit still runs on close: its thread ends after its attempt")
            return
        committed = busy and self._took_commit()
        if self._open.begun and not committed and not self._unusable:
            try:
                self._producer.abort_transaction(CLOSE_WAIT_S)
            except KafkaException as exc:
                log.debug("could not abort the open transaction on close: %s", exc)
        self._open = OpenTransaction()
        self._waiting.take_all()
        try:
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.flush(0)
        except KafkaException:
            pass

    def _took_commit(self) -> bool:
        """Take the ended commit's outcome on close: whether it committed."""
        try:
            self._committer.take()
        except KafkaException as exc:
            log.debug("the commit in flight on close failed: %s", exc)
            return False
        return True

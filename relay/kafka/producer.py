"""The Kafka side: an idempotent producer, batches in flight, and their delivery reports.

Idempotence, acks=all and the gapless guarantee are forced (relay.kafka.config.FORCED): librdkafka
then keeps order per partition with up to 5 requests in flight, never duplicates on its own
retries, and stops at a record batch the broker refuses for good. A message that times out can
still leave a gap while later messages succeed, and a fatal error makes the instance unusable,
so after any failure the relay drops this producer, builds a new one and replays from the
checkpoint (docs/faults.md, "Delivery errors").

`LibrdkafkaProducer` holds what every producer of the relay shares: building the librdkafka instance,
logging its client errors, and `_produce_all`, the one produce loop (each message with the
parcel's bound callback, serving reports while the local queue is full). `IdempotentPublisher` is the
at-least-once producer; relay.kafka.transactions builds the exactly-once one on the same base.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from relay.core.config import WAIT_SLICE_S
from relay.core.errors import BatchRefusedError, DeliveryError, ProducerFatalError
from relay.core.window import Parcel
from relay.kafka.config import FORCED
from relay.kafka.errors import config_error, has_code, kafka_error, producing, translate

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger("kafka.producer")


class ForcedPropertyNotice(logging.Filter):
    """Drops librdkafka's notice, at every producer build, that a property the relay forces is
    experimental (`enable.gapless.guarantee`, relay.kafka.config.FORCED): nothing to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("CONFWARN" in text and any(f"{key} is experimental" in text for key in FORCED))


librdkafka_log.addFilter(ForcedPropertyNotice())

DRAIN_SLICE_S = 0.01  # longest a drain flushes before it checks for a failed report


class ProduceRefused(Exception):
    """Raised when librdkafka refused a message in produce(): its error (`cause`), the event and
    topic it was handed (what a refusal names), and how many messages of the parcel it had
    taken before (`handed`)."""

    def __init__(self, cause: KafkaException, event_id: str, topic: str, handed: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.event_id = event_id
        self.topic = topic
        self.handed = handed


def parcel_failure(parcel: Parcel) -> Exception:
    """The error for the first failed report of `parcel` (relay.kafka.errors.translate).

    A permanent refusal (too large for the topic, invalid record) of a message sent alone names
    its event (PoisonEventError); in a batch it may be any message of the broker's record batch,
    so the batch is to be replayed one message per request (BatchRefusedError). A refused ACL
    names the failed message's topic. Anything else is a DeliveryError: drop the producer and
    replay from the checkpoint.
    """
    assert parcel.failure is not None, "no failed report"
    value, err = parcel.failure
    topics = [m.topic for m in parcel.messages if m.value == value]
    batch = 0 if parcel.one_by_one else len(parcel.messages)
    return translate(err, producing(topics, parcel.failed_event_id(), batch, step="deliver"))


class LibrdkafkaProducer:
    """A librdkafka producer built from `config` (ConfigError naming the property it refuses),
    its client errors logged, and the produce loop every relay producer uses."""

    def __init__(self, config: dict[str, Any]) -> None:
        try:
            self._producer = Producer({**config, "error_cb": self._on_error, "logger": librdkafka_log})
        except KafkaException as exc:
            raise config_error(exc) from exc

    def _on_error(self, err: KafkaError) -> None:
        # Client-level errors: librdkafka keeps retrying and reports per-message failures
        # through delivery reports, so only "all brokers down" and fatal ones are warnings.
        important = err.fatal() or err.code() == KafkaError._ALL_BROKERS_DOWN
        log.log(logging.WARNING if important else logging.DEBUG, "kafka client: %s", err)

    def _produce_all(self, parcel: Parcel, while_waiting: Callable[[], None]) -> None:
        """Hand every message of `parcel` to the producer with its bound report callback,
        blocking only while the local queue is full (then serving reports and `while_waiting`).
        Raises ProduceRefused naming the message produce() refused, or poll()'s KafkaException."""
        produce, on_delivery, poll = self._producer.produce, parcel.on_delivery, self._poll
        for handed, m in enumerate(parcel.messages):
            while True:
                try:
                    produce(m.topic, m.value, m.key, headers=m.headers, on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: serve reports, then retry
                    poll(WAIT_SLICE_S)
                    while_waiting()
                except KafkaException as exc:
                    raise ProduceRefused(exc, m.event_id, m.topic, handed) from exc

    def _poll(self, timeout: float) -> int:
        return int(self._producer.poll(timeout))

    def failure(self, parcel: Parcel) -> Exception:
        return parcel_failure(parcel)

    def _refused(self, exc: KafkaException | ProduceRefused) -> Exception:
        """The relay's error for a refusal by produce() (naming its event and topic) or poll()/flush()."""
        if isinstance(exc, ProduceRefused):
            return translate(kafka_error(exc.cause), producing([exc.topic], exc.event_id))
        return translate(kafka_error(exc), producing([]))

    @property
    def queued(self) -> int:
        """Messages still awaiting a delivery report."""
        return len(self._producer)


class IdempotentPublisher(LibrdkafkaProducer):
    """One idempotent producer instance (relay.core.boundaries.Publisher).

    `send()` hands a parcel's messages to the producer; `poll()` runs the callbacks that are
    due. Reports arrive in send order per partition. After the first failed report everything
    still queued or in flight is purged (its reports fail next), so no later message of a
    partition is written before the replay of the failed one.

    A record batch the broker refuses for good stops the producer at once (the forced
    `enable.gapless.guarantee`: librdkafka raises _GAPLESS_GUARANTEE from poll or flush and sends
    nothing more). The publisher keeps that error (`_gap`) instead of raising it: the refused
    batch's own report still comes, later parcels fail with the gap without being handed
    over, and a parcel that failed only as a consequence (its messages purged or refused out of
    sequence) is replayed one message per request (BatchRefusedError), which finds the cause.
    """

    def __init__(self, producer_config: dict[str, Any]) -> None:
        super().__init__(producer_config)
        self._failed: list[Parcel] = []  # parcels whose first failed report was served
        self._gap: KafkaError | None = None  # why librdkafka stopped the producer at a refused batch

    def send(self, parcel: Parcel, while_waiting: Callable[[], None]) -> None:
        """Hand every message to the producer (blocking only while its queue is full); once the
        producer stopped at a gap, none: the parcel fails with the gap."""
        parcel.failures = self._failed
        handed = 0
        try:
            if self._gap is None:
                self._produce_all(parcel, while_waiting)
                handed = len(parcel.messages)
            self._poll(0)
        except ProduceRefused as exc:
            if not self._learned_gap():
                raise self._refused(exc) from exc
            handed = exc.handed
        except KafkaException as exc:
            raise self._refused(exc) from exc
        if self._gap is not None and handed < len(parcel.messages):
            parcel.refuse(len(parcel.messages) - handed, (b"", self._gap))

    def failure(self, parcel: Parcel) -> Exception:
        """The error for `parcel`'s first failed report (`parcel_failure`); after a gap, a report
        that failed only as its consequence asks for the parcel to be replayed one by one."""
        error = parcel_failure(parcel)
        if self._gap is not None and not parcel.one_by_one and isinstance(error, DeliveryError | ProducerFatalError):
            return BatchRefusedError(
                f"the broker refused a record batch ({self._gap.str()}); replaying it one message at a time",
                len(parcel.messages),
            )
        return error

    def poll(self, timeout: float) -> None:
        """Run delivery callbacks that are due (waiting up to `timeout` for one); after a failed
        report, drop everything still queued or in flight (their reports fail next)."""
        try:
            self._poll(timeout)
        except KafkaException as exc:
            raise self._refused(exc) from exc

    def due_in(self) -> float | None:
        """Nothing is held open (no transactions): the loop decides when to wait."""
        return None

    def drain(self, timeout: float) -> None:
        """Wait up to `timeout` for every report. librdkafka's flush sends what linger.ms holds
        back at once (since 1.8): the loop hands a whole batch over before it waits, so nothing
        more would join it, and lingering would only delay its acknowledgement.

        Flushes in slices of DRAIN_SLICE_S: after a failed report the rest is dropped within one
        slice (as `poll` does at once), not after `timeout`, so librdkafka does not get the time
        to send what was queued behind the failed message (docs/faults.md, row 11)."""
        deadline = time.monotonic() + timeout
        try:
            while self._flush(DRAIN_SLICE_S) and not self._failed and time.monotonic() < deadline:
                pass
            self._poll(0)
        except KafkaException as exc:
            raise self._refused(exc) from exc

    def _flush(self, timeout: float) -> int:
        try:
            return int(self._producer.flush(timeout))
        except KafkaException as exc:
            self._stopped_at_gap(exc)
            return len(self._producer)

    def _poll(self, timeout: float) -> int:
        try:
            served = super()._poll(timeout)
        except KafkaException as exc:
            self._stopped_at_gap(exc)
            served = 0
        if self._failed:
            self._failed.clear()
            self._producer.purge(in_queue=True, in_flight=True)
        return served

    def _learned_gap(self) -> bool:
        """Whether the producer stopped at a gap, serving what is due to learn it (produce() refuses
        with _FATAL before poll has raised the gap); another error is left to the caller's."""
        with contextlib.suppress(KafkaException):
            self._poll(0)
        return self._gap is not None

    def _stopped_at_gap(self, exc: KafkaException) -> None:
        """Keep librdkafka's gapless stop (drop what it still holds); re-raise any other error."""
        if not has_code(exc, KafkaError._GAPLESS_GUARANTEE):
            raise exc
        self._gap = kafka_error(exc)
        self._producer.purge(in_queue=True, in_flight=True)

    def close(self) -> None:
        """Drop whatever is still queued or in flight; nothing here was checkpointed."""
        self._producer.purge(in_queue=True, in_flight=True)
        self._producer.flush(0)


def check_config(producer_config: dict[str, Any]) -> None:
    """Raise ConfigError naming the property if librdkafka refuses the producer configuration."""
    IdempotentPublisher(producer_config).close()

"""The producer of `outbox-relay replay`: the relay's own configuration (idempotence, acks=all and
the gapless guarantee forced, relay.kafka.config), with no lease and no offsets record.

Messages are handed over in chunks; `confirm()` returns once every message handed so far is
acknowledged, raising the relay's error for the first failed report (relay.kafka.errors). Only
then may the caller record its progress (a resume continues after what was confirmed).

In exactly-once mode (RELAY_DELIVERY=exactly-once) every chunk is a Kafka transaction of its own
under the replay's transactional.id (`outbox-relay:replay-<replay id>`, distinct from every lease's,
so it fences no relay and no relay fences it); `confirm()` commits it. read_committed consumers
see a chunk whole or not at all; an interrupted replay's open transaction is aborted (or times
out: RELAY_KAFKA_TRANSACTION_TIMEOUT_MS).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaException

from relay.core.errors import DeliveryError
from relay.core.message import OutgoingMessage
from relay.core.window import Parcel
from relay.kafka.config import KafkaConfig
from relay.kafka.errors import Attempt, kafka_error, translate
from relay.kafka.offsets_record import transactional_id
from relay.kafka.producer import LibrdkafkaProducer, ProduceRefused, parcel_failure
from relay.kafka.transactions import transactional_config


def replay_lease_id(replay_id: str) -> str:
    """The name a replay's transactional.id is made of (never a lease's)."""
    return f"replay-{replay_id}"


class ReplayPublisher(LibrdkafkaProducer):
    """An idempotent (or, exactly-once, transactional) producer for one replay (module docstring)."""

    def __init__(self, config: KafkaConfig, replay_id: str, timeout_s: float) -> None:
        self._transactional = config.exactly_once
        self._tid = transactional_id(replay_lease_id(replay_id))
        super().__init__(
            transactional_config(config, replay_lease_id(replay_id))
            if self._transactional
            else config.producer_config()
        )
        self._timeout_s = max(timeout_s, config.transaction_timeout_ms / 1000 if self._transactional else 0)
        self._parcels: list[Parcel] = []
        self._open = False
        if self._transactional:
            self._call("init_transactions", lambda: self._producer.init_transactions(self._timeout_s))

    def send(self, messages: Sequence[OutgoingMessage]) -> None:
        """Hand `messages` to the producer, in order (blocking only while its queue is full); in
        exactly-once mode inside the open transaction (begun here when none is open)."""
        if not messages:
            return
        if self._transactional and not self._open:
            self._call("begin_transaction", self._producer.begin_transaction)
            self._open = True
        now = time.monotonic()
        parcel = Parcel([-1] * len(messages), list(messages), None, now)
        self._parcels.append(parcel)
        try:
            self._produce_all(parcel, _nothing)
            self._poll(0)
        except (KafkaException, ProduceRefused) as exc:
            raise self._refused(exc) from exc

    def confirm(self) -> None:
        """Return once every message handed over is acknowledged (exactly-once: its transaction
        committed); raise the error of the first failed report (what it names: relay.kafka.errors)."""
        try:
            if self._transactional and self._open:
                self._call("commit_transaction", lambda: self._producer.commit_transaction(self._timeout_s))
                self._open = False
            deadline = time.monotonic() + self._timeout_s
            while len(self._producer) and time.monotonic() < deadline:
                self._producer.flush(0.1)
                self._raise_failure()
        except KafkaException as exc:
            raise self._refused(exc) from exc
        self._raise_failure()
        if len(self._producer):
            raise DeliveryError("?", f"{len(self._producer)} messages not acknowledged within {self._timeout_s:.0f} s")
        self._parcels.clear()

    def close(self) -> None:
        """Drop what was not confirmed (its progress was not recorded: a resume sends it again);
        abort the open transaction."""
        if self._transactional and self._open:
            with contextlib.suppress(KafkaException):  # else it times out on the broker (transaction.timeout.ms)
                self._producer.abort_transaction(5)
            self._open = False
        self._producer.purge(in_queue=True, in_flight=True)
        self._producer.flush(0)

    def _raise_failure(self) -> None:
        for parcel in self._parcels:
            if parcel.failure is not None:
                raise parcel_failure(parcel)

    def _call(self, step: str, call: Callable[[], object]) -> None:
        """Run a transaction step; a refusal names the replay's transactional id."""
        try:
            call()
        except KafkaException as exc:
            needs = (("TRANSACTIONAL_ID", self._tid, "WRITE, DESCRIBE"),)
            raise translate(kafka_error(exc), Attempt(f"{step} (outbox-relay replay)", needs)) from exc


def _nothing() -> None:
    pass

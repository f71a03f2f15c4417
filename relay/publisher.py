"""The Kafka side: an idempotent producer, batches in flight, and their delivery reports.

Idempotence and acks=all are forced (config.FORCED_KAFKA): librdkafka then keeps order per
partition with up to 5 requests in flight and never duplicates on its own retries. A failed
delivery can still leave a gap while later messages succeed, and a fatal error makes the
instance unusable, so after any failure the relay drops this producer, builds a new one and
replays from the checkpoint (FAULTS.md, "Delivery errors").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from relay.config import Settings, kafka_env_name
from relay.encoding import OutgoingMessage
from relay.errors import (
    BatchRefusedError, ConfigError, DeliveryError, PoisonEventError, ProducerFatalError,
)

log = logging.getLogger(__name__)

# Delivery errors that retrying the same message can never fix: the event is poison.
_PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE: "larger than the broker accepts for this topic",
    KafkaError.INVALID_RECORD: "rejected by the broker as an invalid record",
    KafkaError.TOPIC_EXCEPTION: "the topic name is invalid",
}
_WAIT_SLICE_S = 0.5


class InFlight:
    """One batch handed to the producer: its token and how many reports are still due.

    Its bound `on_delivery` is the delivery callback of every message of the batch, so
    counting costs no per-message closure.
    """

    __slots__ = ("messages", "token", "pending", "failure", "sent_at")

    def __init__(self, messages: Sequence[OutgoingMessage], token: Any, sent_at: float) -> None:
        self.messages = messages
        self.token = token
        self.pending = len(messages)
        self.failure: tuple[bytes, KafkaError] | None = None
        self.sent_at = sent_at

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None and self.failure is None:
            self.failure = (msg.value() or b"", err)  # failed reports carry no headers

    @property
    def done(self) -> bool:
        return self.pending == 0

    def raise_failure(self, isolated: bool) -> None:
        """Raise the error for the first failed delivery of this batch, if any."""
        if self.failure is None:
            return
        value, err = self.failure
        event_id = next((m.event_id for m in self.messages if m.value == value), "?")
        if err.code() in _PERMANENT:
            if isolated:
                raise PoisonEventError(event_id, f"{_PERMANENT[err.code()]} ({err.name()})")
            raise BatchRefusedError(f"the broker refused a record batch ({err.name()}: "
                                    f"{_PERMANENT[err.code()]}); replaying it one message at a time")
        raise DeliveryError(event_id, err)


class Publisher:
    """Publishes batches with one producer instance.

    `send()` hands a batch to the producer and returns its `InFlight`; `wait()` blocks until
    every report of a batch is in and raises the batch's first failure. Reports arrive in
    send order per partition; a batch is acknowledged when all its reports succeeded.
    """

    def __init__(self, settings: Settings) -> None:
        config: dict[str, Any] = {**settings.kafka_config(), "error_cb": self._on_error,
                                  "logger": logging.getLogger("kafka.producer")}
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise _config_error(exc) from None

    def _on_error(self, err: KafkaError) -> None:
        # Client-level errors: librdkafka keeps retrying and reports per-message failures
        # through delivery reports, so only "all brokers down" and fatal ones are warnings.
        important = err.fatal() or err.code() == KafkaError._ALL_BROKERS_DOWN
        log.log(logging.WARNING if important else logging.DEBUG, "kafka client: %s", err)

    def send(self, messages: Sequence[OutgoingMessage], token: Any, now: float,
             while_waiting: Callable[[], None]) -> InFlight:
        """Hand every message to the producer (blocking only while its queue is full)."""
        batch = InFlight(messages, token, now)
        produce, on_delivery, poll = self._producer.produce, batch.on_delivery, self._producer.poll
        current = "?"
        try:
            for m in messages:
                current = m.event_id
                while True:
                    try:
                        produce(m.topic, m.value, m.key, headers=m.headers, on_delivery=on_delivery)
                        break
                    except BufferError:  # local queue full: serve reports, then retry
                        poll(_WAIT_SLICE_S)
                        while_waiting()
            poll(0)
        except KafkaException as exc:
            raise _produce_error(exc, current) from exc
        return batch

    def serve(self, timeout: float = 0) -> None:
        """Run delivery callbacks that are due (waiting up to `timeout` for one)."""
        try:
            self._producer.poll(timeout)
        except KafkaException as exc:
            raise _produce_error(exc, "?") from exc

    def wait(self, batch: InFlight, while_waiting: Callable[[], None], isolated: bool = False) -> None:
        """Block until every report of `batch` is in; raise its first failure."""
        while not batch.done:
            self.serve(_WAIT_SLICE_S)
            while_waiting()
        batch.raise_failure(isolated)

    def publish(self, messages: Sequence[OutgoingMessage], while_waiting: Callable[[], None],
                one_by_one: bool = False) -> None:
        """Send and wait: return only once the broker acknowledged every message.

        With `one_by_one` each message is its own request, so a refused record batch names
        its event (PoisonEventError) instead of raising BatchRefusedError.
        """
        groups = [[m] for m in messages] if one_by_one else [messages]
        for group in groups:
            self.wait(self.send(group, None, 0.0, while_waiting), while_waiting, isolated=one_by_one)

    @property
    def queued(self) -> int:
        return len(self._producer)

    def close(self) -> None:
        """Drop whatever is still queued or in flight; nothing here was checkpointed."""
        self._producer.purge(in_queue=True, in_flight=True)
        self._producer.flush(0)


def _produce_error(exc: KafkaException, event_id: str) -> Exception:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and err.fatal():
        return ProducerFatalError(f"producer unusable: {err}")
    if isinstance(err, KafkaError) and err.code() in _PERMANENT:
        return PoisonEventError(event_id, _PERMANENT[err.code()])
    return DeliveryError(event_id, err)


# librdkafka names an aliased property by its canonical name; errors name what the user set.
_ALIASES = {"queue.buffering.max.ms": "linger.ms", "compression.codec": "compression.type",
            "message.send.max.retries": "retries", "request.required.acks": "acks",
            "metadata.broker.list": "bootstrap.servers"}


def check_config(settings: Settings) -> None:
    """Raise ConfigError naming the property if librdkafka refuses the producer configuration."""
    Publisher(settings).close()


def _config_error(exc: KafkaException) -> ConfigError:
    err = exc.args[0] if exc.args else exc
    text = err.str() if isinstance(err, KafkaError) else str(err)
    # librdkafka says e.g.: No such configuration property: "foo.bar"
    names = re.findall(r'"([a-z0-9_.]+)"', text)
    prop = _ALIASES.get(names[-1], names[-1]) if names else None
    setting = kafka_env_name(prop) if prop else "RELAY_KAFKA_*"
    return ConfigError(setting, f"Kafka client refused the configuration: {text}")

"""The Kafka side: an idempotent producer that publishes one batch and waits for every report.

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


class Publisher:
    """Publishes batches with one producer instance; `publish()` is all-or-error."""

    def __init__(self, settings: Settings) -> None:
        config: dict[str, Any] = {**settings.kafka_config(), "error_cb": self._on_error,
                                  "logger": logging.getLogger("kafka.producer")}
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise _config_error(exc) from None
        self._failure: tuple[bytes, KafkaError] | None = None

    def _on_error(self, err: KafkaError) -> None:
        # Client-level errors: librdkafka keeps retrying and reports per-message failures
        # through delivery reports, so only "all brokers down" and fatal ones are warnings.
        important = err.fatal() or err.code() == KafkaError._ALL_BROKERS_DOWN
        log.log(logging.WARNING if important else logging.DEBUG, "kafka client: %s", err)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None and self._failure is None:
            self._failure = (msg.value() or b"", err)  # failed reports carry no headers

    def publish(self, messages: Sequence[OutgoingMessage], while_waiting: Callable[[], None],
                one_by_one: bool = False) -> None:
        """Send every message and return only once the broker acknowledged all of them.

        `while_waiting` runs between short waits (lease renewal, stop checks). Raises
        DeliveryError (restart and replay), ProducerFatalError (the instance is unusable),
        BatchRefusedError (the broker refused a record batch for good; which event caused it is
        unknown, since the broker judges whole batches) or, with `one_by_one` (each message
        its own request), PoisonEventError naming the refused event.
        """
        if one_by_one:
            for m in messages:
                self._publish([m], while_waiting, isolated=True)
        else:
            self._publish(messages, while_waiting, isolated=False)

    def _publish(self, messages: Sequence[OutgoingMessage], while_waiting: Callable[[], None],
                 isolated: bool) -> None:
        self._failure = None
        produce, on_delivery = self._producer.produce, self._on_delivery
        current = "?"
        try:
            for m in messages:
                current = m.event_id
                while True:
                    try:
                        produce(m.topic, m.value, m.key, headers=m.headers, on_delivery=on_delivery)
                        break
                    except BufferError:  # local queue full: serve reports, then retry
                        self._producer.poll(_WAIT_SLICE_S)
                        while_waiting()
                self._producer.poll(0)
            while self._producer.flush(_WAIT_SLICE_S) > 0:
                while_waiting()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.fatal():
                raise ProducerFatalError(f"producer unusable: {err}") from exc
            if isinstance(err, KafkaError) and err.code() in _PERMANENT:
                raise PoisonEventError(current, _PERMANENT[err.code()]) from exc
            raise DeliveryError(current, err) from exc
        if self._failure is not None:
            value, err = self._failure
            event_id = next((m.event_id for m in messages if m.value == value), "?")
            if err.code() in _PERMANENT:
                if isolated:
                    raise PoisonEventError(event_id, f"{_PERMANENT[err.code()]} ({err.name()})")
                raise BatchRefusedError(f"the broker refused a record batch ({err.name()}: "
                                        f"{_PERMANENT[err.code()]}); replaying it one message at a time")
            raise DeliveryError(event_id, err)

    @property
    def queued(self) -> int:
        return len(self._producer)

    def close(self) -> None:
        """Drop whatever is still queued or in flight; nothing here was checkpointed."""
        self._producer.purge(in_queue=True, in_flight=True)
        self._producer.flush(0)


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

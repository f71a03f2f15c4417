"""The Kafka side: an idempotent producer, batches in flight, and their delivery reports.

Idempotence and acks=all are forced (config.FORCED_KAFKA): librdkafka then keeps order per
partition with up to 5 requests in flight and never duplicates on its own retries. A failed
delivery can still leave a gap while later messages succeed, and a fatal error makes the
instance unusable, so after any failure the relay drops this producer, builds a new one and
replays from the checkpoint (docs/faults.md, "Delivery errors").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from relay.config import Settings, kafka_env_name
from relay.errors import (
    BatchRefusedError, ConfigError, DeliveryError, PoisonEventError, ProducerFatalError,
)
from relay.window import Delivery

log = logging.getLogger(__name__)

# Delivery errors that retrying the same message can never fix: the event is poison.
_PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE: "larger than the broker accepts for this topic",
    KafkaError.INVALID_RECORD: "rejected by the broker as an invalid record",
    KafkaError.TOPIC_EXCEPTION: "the topic name is invalid",
}
_WAIT_SLICE_S = 0.5  # longest a blocked send waits before serving the lease heartbeat


def delivery_failure(delivery: Delivery) -> Exception:
    """The error for the first failed report of `delivery`.

    A permanent refusal (too large for the topic, invalid record) of a message sent alone names
    its event (PoisonEventError); in a batch it may be any message of the broker's record batch,
    so the batch is to be replayed one message per request (BatchRefusedError). Anything else is
    a DeliveryError: drop the producer and replay from the checkpoint.
    """
    assert delivery.failure is not None, "no failed report"
    err = delivery.failure[1]
    event_id = delivery.failed_event_id()
    code = err.code()
    if code in _PERMANENT:
        if delivery.one_by_one:
            return PoisonEventError(event_id, f"{_PERMANENT[code]} ({err.name()})")
        return BatchRefusedError(f"the broker refused a record batch ({err.name()}: {_PERMANENT[code]}); "
                                 "replaying it one message at a time", len(delivery.messages))
    return DeliveryError(event_id, err)


class Publisher:
    """One idempotent producer instance (relay.boundaries.Publisher).

    `send()` hands a delivery's messages to the producer with the delivery's bound callback;
    `poll()` runs the callbacks that are due. Reports arrive in send order per partition.
    """

    def __init__(self, settings: Settings) -> None:
        config: dict[str, Any] = {**settings.kafka_config(), "error_cb": self._on_error,
                                  "logger": logging.getLogger("kafka.producer")}
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise _config_error(exc) from None
        self._failed: list[Delivery] = []  # deliveries whose first failed report was served

    def _on_error(self, err: KafkaError) -> None:
        # Client-level errors: librdkafka keeps retrying and reports per-message failures
        # through delivery reports, so only "all brokers down" and fatal ones are warnings.
        important = err.fatal() or err.code() == KafkaError._ALL_BROKERS_DOWN
        log.log(logging.WARNING if important else logging.DEBUG, "kafka client: %s", err)

    def send(self, delivery: Delivery, while_waiting: Callable[[], None]) -> None:
        """Hand every message to the producer (blocking only while its queue is full)."""
        delivery.failures = self._failed
        produce, on_delivery, poll = self._producer.produce, delivery.on_delivery, self._poll
        current = "?"
        try:
            for m in delivery.messages:
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

    def poll(self, timeout: float) -> None:
        """Run delivery callbacks that are due (waiting up to `timeout` for one); after a failed
        report, drop everything still queued or in flight (their reports fail next)."""
        try:
            self._poll(timeout)
        except KafkaException as exc:
            raise _produce_error(exc, "?") from exc

    def _poll(self, timeout: float) -> int:
        served = self._producer.poll(timeout)
        if self._failed:
            self._failed.clear()
            self._producer.purge(in_queue=True, in_flight=True)
        return served  # type: ignore[no-any-return]

    def failure(self, delivery: Delivery) -> Exception:
        return delivery_failure(delivery)

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

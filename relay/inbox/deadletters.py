"""The dead-letter producer of the inbox (policy `dead-letter`): idempotent, acks=all, one message
at a time, acknowledged before the poison event's offset is committed."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException, Producer

from relay.inbox.batching import Poisoned
from relay.inbox.config import RunOptions
from relay.inbox.consumer import Received
from relay.inbox.poison import dead_letter

FLUSH_TIMEOUT_S = 30.0


class DeadLetterSender:
    """Sends a poison message to the dead-letter topic and waits for the broker's acknowledgement."""

    def __init__(self, options: RunOptions) -> None:
        self._topic = options.dead_letter_topic
        self._group = options.group_id
        self._producer = Producer(options.producer_config())

    def send(self, poisoned: Poisoned, msg: Received) -> None:
        """Returns once the broker acknowledged the dead letter; raises KafkaException otherwise."""
        record = dead_letter(poisoned, self._topic, self._group, msg.key, msg.value, list(msg.raw_headers))
        errors: list[Any] = []
        self._producer.produce(
            record.topic,
            value=record.value,
            key=record.key,
            headers=record.headers,
            on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
        )
        if self._producer.flush(FLUSH_TIMEOUT_S) > 0:
            raise KafkaException(f"dead letter for {poisoned.event_id} not acknowledged within {FLUSH_TIMEOUT_S} s")
        if errors:
            raise KafkaException(errors[0])

    def close(self) -> None:
        self._producer.flush(FLUSH_TIMEOUT_S)

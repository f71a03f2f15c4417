"""Where an inbox run reads its messages and sends its dead letters: Kafka (relay.inbox.consumer,
relay.inbox.deadletters), NATS JetStream (relay.inbox.jetstream, needing the `nats` extra) or a
RabbitMQ queue (relay.inbox.rabbitmq, needing the `rabbitmq` extra), chosen by the run's options.
Both inboxes take them through these two small protocols."""

from __future__ import annotations

from typing import Protocol

from relay.inbox.batching import BatchLimits, Poisoned
from relay.inbox.config import RunOptions
from relay.inbox.consumer import KafkaSource, Received, Stopping
from relay.inbox.deadletters import DeadLetterSender


class MessageSource(Protocol):
    """Batches in delivery order, and their acknowledgement once applied."""

    def gather(self, limits: BatchLimits, stop: Stopping) -> list[Received]: ...
    def commit(self, offsets: dict[tuple[str, int], int]) -> bool: ...
    def lags(self) -> dict[tuple[str, int], int]: ...
    def close(self) -> None: ...


class DeadLetters(Protocol):
    """Sends a poison message to the dead-letter topic (or subject); returns once stored."""

    def send(self, poisoned: Poisoned, msg: Received) -> None: ...
    def close(self) -> None: ...


def open_source(options: RunOptions) -> MessageSource:
    if options.broker == "nats":
        from relay.inbox.jetstream import JetStreamSource

        return JetStreamSource(options)
    if options.broker == "rabbitmq":
        from relay.inbox.rabbitmq import RabbitSource

        return RabbitSource(options)
    return KafkaSource(options)


def open_dead_letters(options: RunOptions) -> DeadLetters:
    if options.broker == "nats":
        from relay.inbox.jetstream import JetStreamDeadLetters

        return JetStreamDeadLetters(options)
    if options.broker == "rabbitmq":
        from relay.inbox.rabbitmq import RabbitDeadLetters

        return RabbitDeadLetters(options)
    return DeadLetterSender(options)

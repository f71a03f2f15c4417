"""outbox-relay: publishes a MongoDB outbox collection to Kafka, in order, at least once."""

from relay.outbox import Outbox, OutboxEvent

__all__ = ["Outbox", "OutboxEvent"]
__version__ = "0.1.0"

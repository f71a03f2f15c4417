"""The two delivery modes (RELAY_DELIVERY) as the loop's Producers boundary: each leading session
gets a fresh producer and the point it resumes from, in one call, so no caller needs to know which
mode it runs.

- `AtLeastOnce`: an idempotent producer (relay.kafka.producer); the session resumes at the lease
  document's checkpoint, or, when that checkpoint was stored by an exactly-once relay (the mode was
  switched back), after the newer of it and the offsets topic's record (relay.core.resume).
- `ExactlyOnce`: a transactional producer (relay.kafka.transactions), which first fences every
  earlier producer of the lease, then resumes after the newer of the MongoDB checkpoint and the
  offsets topic's newest committed record.

Both are per lease, so with partitions each partition has its own.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.core.boundaries import Publisher as PublisherBoundary
from relay.core.positions import Checkpoint, Grant
from relay.core.resume import after_exactly_once
from relay.kafka.config import KafkaConfig
from relay.kafka.offsets_topic import OffsetsTopic
from relay.kafka.producer import Publisher, check_config
from relay.kafka.transactions import TransactionalPublisher, check_transactional_config, log_choice


class AtLeastOnce:
    """RELAY_DELIVERY=at-least-once (relay.core.boundaries.Producers)."""

    def __init__(self, config: KafkaConfig, lease_id: str, fingerprint: str, offsets: OffsetsTopic) -> None:
        self._config = config
        self._lease_id = lease_id
        self._fingerprint = fingerprint
        self._offsets = offsets

    def check(self) -> None:
        """ConfigError naming the property librdkafka refuses (run at start)."""
        check_config(self._config.producer_config())

    def start(self, grant: Grant, heartbeat: Callable[[], None]) -> tuple[PublisherBoundary, Checkpoint]:
        publisher = Publisher(self._config.producer_config())
        try:
            chosen = after_exactly_once(
                grant.checkpoint,
                lambda: self._offsets.read(self._lease_id, heartbeat, missing_ok=True),
                self._fingerprint,
                self._offsets.topic,
            )
        except BaseException:
            publisher.close()
            raise
        log_choice(grant.checkpoint, chosen, self._offsets.topic)
        return publisher, chosen


class ExactlyOnce:
    """RELAY_DELIVERY=exactly-once (relay.core.boundaries.Producers)."""

    def __init__(
        self, config: KafkaConfig, lease_id: str, fingerprint: str, offsets: OffsetsTopic, start_at: str
    ) -> None:
        self._config = config
        self._lease_id = lease_id
        self._fingerprint = fingerprint
        self._offsets = offsets
        self._start_at = start_at

    def check(self) -> None:
        """ConfigError naming the property librdkafka refuses (run at start)."""
        check_transactional_config(self._config, self._lease_id)

    def start(self, grant: Grant, heartbeat: Callable[[], None]) -> tuple[PublisherBoundary, Checkpoint]:
        publisher = TransactionalPublisher(
            self._config, self._lease_id, self._offsets, self._fingerprint, self._start_at
        )
        try:
            return publisher, publisher.resume_point(grant, heartbeat)
        except BaseException:
            publisher.close()
            raise

"""The two delivery modes (RELAY_DELIVERY) as the loop's DeliveryMode boundary: each leading session
gets a fresh producer, and the mode supplies what the resume decision (relay.core.resume) reads
from Kafka and carries out what that decision asks of Kafka, so no caller needs to know which mode
it runs. The decision itself is the loop's to make (relay.core.loop).

- `AtLeastOnce`: an idempotent producer (relay.kafka.producer). The offsets record is read only
  when the decision asks (a checkpoint stored by an exactly-once relay: the mode was switched
  back), and a missing offsets topic reads as no record.
- `ExactlyOnce`: a transactional producer (relay.kafka.transactions), which fences every earlier
  producer of the lease before anything is read; then the offsets topic's newest committed
  record, and, when the decision says so, its tombstone.

Both are per lease, so with partitions each partition has its own.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.core.boundaries import Publisher
from relay.core.config import AT_LEAST_ONCE, EXACTLY_ONCE
from relay.core.positions import Grant
from relay.kafka.config import KafkaConfig
from relay.kafka.offsets_record import OffsetsRecord
from relay.kafka.offsets_topic import OffsetsTopic
from relay.kafka.producer import IdempotentPublisher
from relay.kafka.transactions import TransactionalPublisher

Heartbeat = Callable[[], None]


class AtLeastOnce:
    """RELAY_DELIVERY=at-least-once (relay.core.boundaries.DeliveryMode)."""

    name = AT_LEAST_ONCE

    def __init__(self, config: KafkaConfig, lease_id: str, offsets: OffsetsTopic) -> None:
        self._config = config
        self._lease_id = lease_id
        self._offsets = offsets

    @property
    def offsets_topic(self) -> str:
        return self._offsets.topic

    def start(self, grant: Grant, heartbeat: Heartbeat) -> Publisher:
        return IdempotentPublisher(self._config.producer_config())

    def committed_record(self, heartbeat: Heartbeat) -> OffsetsRecord | None:
        """The lease's newest committed offsets record, left by an exactly-once run; None when
        there is none or no offsets topic (it is not created for this)."""
        return self._offsets.read(self._lease_id, heartbeat, missing_ok=True)

    def forget(self, publisher: Publisher, heartbeat: Heartbeat) -> None:
        """Never asked: only an exactly-once relay forgets offsets records (relay.core.resume)."""
        raise AssertionError("an at-least-once relay writes nothing to the offsets topic")


class ExactlyOnce:
    """RELAY_DELIVERY=exactly-once (relay.core.boundaries.DeliveryMode)."""

    name = EXACTLY_ONCE

    def __init__(self, config: KafkaConfig, lease_id: str, fingerprint: str, offsets: OffsetsTopic) -> None:
        self._config = config
        self._lease_id = lease_id
        self._fingerprint = fingerprint
        self._offsets = offsets

    @property
    def offsets_topic(self) -> str:
        return self._offsets.topic

    def start(self, grant: Grant, heartbeat: Heartbeat) -> Publisher:
        """A transactional producer that has fenced every earlier producer of the lease (so no
        zombie commits after the offsets record is read)."""
        publisher = TransactionalPublisher(self._config, self._lease_id, self._offsets, self._fingerprint)
        try:
            publisher.fence(grant, heartbeat)
        except BaseException:
            publisher.close()
            raise
        return publisher

    def committed_record(self, heartbeat: Heartbeat) -> OffsetsRecord | None:
        """The lease's newest committed offsets record (read_committed, to the topic's end)."""
        return self._offsets.read(self._lease_id, heartbeat)

    def forget(self, publisher: Publisher, heartbeat: Heartbeat) -> None:
        """Tombstone the lease's offsets record with the session's (fenced) producer."""
        assert isinstance(publisher, TransactionalPublisher), "a publisher this mode started"
        publisher.forget_record(heartbeat)

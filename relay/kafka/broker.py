"""Kafka as the process's broker (relay.core.boundaries.Broker): the start-up checks and each
lease's delivery mode (relay.kafka.modes). What is Kafka's alone stays here: librdkafka's
configuration check, the transactional producers and the offsets topic of exactly-once mode."""

from __future__ import annotations

from collections.abc import Sequence

from relay.core.errors import Action
from relay.kafka import errors
from relay.kafka.admin import check_kafka
from relay.kafka.config import KafkaConfig
from relay.kafka.modes import AtLeastOnce, ExactlyOnce
from relay.kafka.offsets_topic import OffsetsTopic
from relay.kafka.producer import check_config
from relay.kafka.transactions import check_transactional_config


class Kafka:
    """RELAY_BROKER=kafka, for the leases `lease_ids` of this process."""

    name = "kafka"

    def __init__(self, config: KafkaConfig, lease_ids: Sequence[str]) -> None:
        self.config = config
        self._lease_ids = list(lease_ids)

    def check_settings(self) -> None:
        """librdkafka accepts the producer configuration (each lease's transactional producer in
        exactly-once mode): ConfigError naming the property."""
        if self.config.exactly_once:
            for lid in self._lease_ids:
                check_transactional_config(self.config, lid)
        else:
            check_config(self.config.producer_config())

    def check_servers(self) -> None:
        """Kafka answers (and, in exactly-once mode, the offsets topic exists, compacted)."""
        check_kafka(self.config)
        if self.config.exactly_once:
            OffsetsTopic(self.config).ensure()

    def mode(self, lease_id: str, fingerprint: str) -> AtLeastOnce | ExactlyOnce:
        """The delivery mode of lease `lease_id` (RELAY_DELIVERY): its producer per session and its
        offsets record."""
        offsets = OffsetsTopic(self.config)
        if self.config.exactly_once:
            return ExactlyOnce(self.config, lease_id, fingerprint, offsets)
        return AtLeastOnce(self.config, lease_id, offsets)

    def action_for(self, exc: BaseException) -> Action | None:
        return errors.action_for(exc)

    def close(self) -> None:
        """Nothing process-wide to close: each session's producer is its own."""

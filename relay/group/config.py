"""What the relay process's group takes from the settings, checked where it is used."""

from __future__ import annotations

from dataclasses import dataclass

from relay.core.errors import ConfigError, env_name
from relay.core.partitions import MAX_PARTITIONS


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """This replica, its outbox, the partition count, and the heartbeat period of the group.

    Invariant checked here: replicas heartbeat every `standby_poll_s` and stop counting as live
    after `lease_ttl_s`; with partitions, where the live replicas decide the shares, the period
    is at most half the TTL.
    """

    instance_id: str
    namespace: str
    partitions: int
    standby_poll_s: float
    lease_ttl_s: float

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(env_name("partitions"), f"must be between 1 and {MAX_PARTITIONS}, got {self.partitions}")
        if self.partitions > 1 and self.standby_poll_s * 2 > self.lease_ttl_s:
            raise ConfigError(
                env_name("standby_poll_s"),
                f"must be at most half of RELAY_LEASE_TTL_S ({self.lease_ttl_s}) with RELAY_PARTITIONS > 1: "
                "replicas heartbeat this often and stop counting as live after the TTL",
            )

"""What the relay process's group takes from the settings, checked where it is used."""

from __future__ import annotations

from dataclasses import dataclass

from relay.core.config import LeaseTiming
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.partitions import MAX_PARTITIONS


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """This replica, its outboxes, the partition count, and the heartbeat period of the group.

    Invariant checked here: replicas heartbeat every RELAY_STANDBY_POLL_S and stop counting as live
    after RELAY_LEASE_TTL_S; with partitions, where the live replicas decide the shares, the period
    is at most half the TTL.
    """

    instance_id: str
    outboxes: tuple[str, ...]  # database.collection of each outbox the group publishes
    partitions: int
    timing: LeaseTiming

    @property
    def name(self) -> str:
        """The group's name in the membership documents: the outbox, or the sorted list of them."""
        return ",".join(sorted(self.outboxes))

    def joined(self) -> str:
        """The line a replica writes once it joined its group: which group and, when the outboxes
        are split, into how many partitions (`4 partitions`, or `4 partitions each` for several)."""
        split = ""
        if self.partitions > 1:
            split = f" ({self.partitions} partitions{' each' if len(self.outboxes) > 1 else ''})"
        return f"relay {self.instance_id} in the group of {self.name}{split}"

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(env_name("partitions"), f"must be between 1 and {MAX_PARTITIONS}, got {self.partitions}")
        timing = self.timing
        if self.partitions > 1 and timing.standby_poll_s * 2 > timing.lease_ttl_s:
            raise ConfigError(
                env_name("standby_poll_s"),
                f"must be at most half of RELAY_LEASE_TTL_S ({timing.lease_ttl_s}) with RELAY_PARTITIONS > 1: "
                "replicas heartbeat this often and stop counting as live after the TTL",
            )

"""What the relay process's group takes from the settings, checked where it is used."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay.core.config import LeaseTiming
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.core.partitions import MAX_PARTITIONS


def group_name(outboxes: Sequence[Namespace]) -> str:
    """The group's name in the membership documents: the outbox, or the sorted list of them."""
    return ",".join(sorted(str(n) for n in outboxes))


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """This replica, the partition count, and the heartbeat period of the group.

    Invariant checked here: replicas heartbeat every RELAY_STANDBY_POLL_S and stop counting as live
    after RELAY_LEASE_TTL_S; with partitions, where the live replicas decide the shares, the period
    is at most half the TTL.
    """

    instance_id: str
    partitions: int
    timing: LeaseTiming

    def joined(self, outboxes: Sequence[Namespace]) -> str:
        """The line a replica of the group of `outboxes` writes once it joined: which group and,
        when the outboxes are split, into how many partitions (`4 partitions`, or `4 partitions
        each` for several)."""
        split = ""
        if self.partitions > 1:
            split = f" ({self.partitions} partitions{' each' if len(outboxes) > 1 else ''})"
        return f"relay {self.instance_id} in the group of {group_name(outboxes)}{split}"

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

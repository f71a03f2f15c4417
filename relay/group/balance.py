"""How a group of replicas shares the leases of its outboxes (pure, no I/O).

The group's leases are its scopes (relay.core.partitions.Scope): every outbox in every partition,
N of them. With RELAY_PARTITIONS > 1 the replicas share them out: every replica computes the same
targets from the same list of live replicas (relay.mongo.membership); sorted by instance id, the
first N mod L of the L live replicas get ceil(N / L) leases and the others floor(N / L); the
targets add up to N. A replica takes free leases (released, or expired by the server's clock)
while it leads fewer than its target, and hands leases above its target over at a batch boundary
(final checkpoint stored, lease released).

Without partitions there is nothing to share (`EveryLease`, the assignment that always answers
yes): every replica may try every lease and none hands one over, so the leases alone decide who
leads and a leader keeps a lease until it stops or loses it (a replica joining never moves one).
`balance_for` is the one place that picks between the two.

`Balance` is this replica's side of the rule: the state of each lease and the target;
`LeaseAssignment` is one lease's view of it, the loop's Assignment boundary.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Sequence


def targets(live: Iterable[str], count: int) -> dict[str, int]:
    """How many partitions each live replica should lead (see the module docstring)."""
    replicas = sorted(set(live))
    if not replicas:
        return {}
    base, extra = divmod(count, len(replicas))
    return {r: base + (1 if i < extra else 0) for i, r in enumerate(replicas)}


class _State(enum.Enum):
    IDLE = "idle"  # not ours
    TRYING = "trying"  # allowed to try the lease (counted against the target until it answers)
    HELD = "held"
    HANDING = "handing"  # held, being handed over


class Balance:
    """This replica's share: the state of each partition's lease and the target. Thread-safe:
    the partitions' relays ask it from their threads, the coordinator sets the target."""

    def __init__(self, count: int) -> None:
        self._states = [_State.IDLE] * count
        self._lock = threading.Lock()
        self.target = 0

    def rebalance(self, me: str, live: Sequence[str]) -> bool:
        """Set this replica's target from the live replicas (it counts itself live even if its own
        heartbeat is not visible yet); whether the target changed."""
        target = targets([*live, me], len(self._states))[me]
        with self._lock:
            changed, self.target = target != self.target, target
        return changed

    def may_lead(self, k: int) -> bool:
        """Try lease k: always when it is held (a restarting leader takes it back),
        else while fewer than the target are held or being tried."""
        with self._lock:
            state = self._states[k]
            if state in (_State.TRYING, _State.HELD):
                return True
            if state is _State.IDLE and self._count(_State.TRYING, _State.HELD) < self.target:
                self._states[k] = _State.TRYING
                return True
            return False

    def led(self, k: int, held: bool) -> None:
        with self._lock:
            self._states[k] = _State.HELD if held else _State.IDLE

    def hand_over(self, k: int) -> bool:
        """Hand lease k over when more than the target are held (one at a time)."""
        with self._lock:
            if self._states[k] is _State.HELD and self._count(_State.HELD) > self.target:
                self._states[k] = _State.HANDING
                return True
            return False

    def leading(self) -> list[int]:
        with self._lock:
            return [k for k, s in enumerate(self._states) if s in (_State.HELD, _State.HANDING)]

    def _count(self, *states: _State) -> int:
        return sum(1 for s in self._states if s in states)


class EveryLease(Balance):
    """Without partitions (the module docstring): every lease may be tried, none is handed over,
    the target is every lease; what is held is still recorded for the group's heartbeat."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.target = count

    def rebalance(self, me: str, live: Sequence[str]) -> bool:
        return False

    def may_lead(self, k: int) -> bool:
        return True

    def hand_over(self, k: int) -> bool:
        return False


def balance_for(count: int, partitions: int) -> Balance:
    """This replica's balance of `count` leases: shared out with RELAY_PARTITIONS > 1, else every lease."""
    return Balance(count) if partitions > 1 else EveryLease(count)


class LeaseAssignment:
    """One lease's view of the `Balance` (relay.core.boundaries.Assignment)."""

    def __init__(self, balance: Balance, index: int) -> None:
        self._balance, self._index = balance, index

    def may_lead(self) -> bool:
        return self._balance.may_lead(self._index)

    def led(self, held: bool) -> None:
        self._balance.led(self._index, held)

    def hand_over(self) -> bool:
        return self._balance.hand_over(self._index)

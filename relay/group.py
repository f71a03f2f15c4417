"""A group of relay replicas sharing the partitions of one outbox (RELAY_PARTITIONS > 1).

A process runs one `relay.relay.Relay` per partition, each in its own thread with its own lease,
change stream and producer (a standby partition holds neither stream nor producer). `Relay` keeps
the order of steps; this module only decides, through each relay's `Assignment`, whether it
should try its lease and whether it should hand it over at its next batch boundary. The rule
(relay.partitioning.targets): every live replica computes the same targets from the same list
of live replicas (relay.membership); a replica tries free partitions while it leads fewer than
its target and hands over the ones above it.

The coordinator (`Group.run`'s own loop) writes this replica's heartbeat every
RELAY_STANDBY_POLL_S, reads the live replicas, and sets the target. Shutdown order, on `stop()`:
mark this replica stopped (the others take its share at once), stop every partition's relay
(each finishes its deliveries, stores its final checkpoint and releases its lease), close the
client. A partition whose relay stops on an error stops the group the same way, and `run()`
raises that error (the process exits with its code, as a single relay would).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Sequence

from pymongo.errors import PyMongoError

from relay.config import Settings
from relay.errors import RelayError
from relay.membership import Membership
from relay.observe import GroupObserver
from relay.partitioning import Partition, target_of
from relay.relay import Relay

log = logging.getLogger("relay")


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

    def set_target(self, target: int) -> None:
        with self._lock:
            self.target = target

    def may_lead(self, k: int) -> bool:
        """Try partition k's lease: always when it is held (a restarting leader takes it back),
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
        """Hand partition k over when more than the target are held (one at a time)."""
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


class PartitionAssignment:
    """One partition's view of the `Balance` (relay.boundaries.Assignment)."""

    def __init__(self, balance: Balance, index: int) -> None:
        self._balance, self._index = balance, index

    def may_lead(self) -> bool:
        return self._balance.may_lead(self._index)

    def led(self, held: bool) -> None:
        self._balance.led(self._index, held)

    def hand_over(self) -> bool:
        return self._balance.hand_over(self._index)


class Group:
    """Runs the partitions' relays of one outbox in this process (see the module docstring).

    `relays` are built for `partitions` with the assignments of `balance`
    (relay.wiring.build_group); `preflight` runs first (checks, the partition count), `close`
    last. Has `run()`, `stop()` and `observer`, like a `Relay`.
    """

    def __init__(self, settings: Settings, relays: Sequence[tuple[Partition, Relay]], balance: Balance,
                 membership: Membership, observer: GroupObserver, preflight: Callable[[], None],
                 close: Callable[[], None]) -> None:
        self.settings = settings
        self.relays = list(relays)
        self.balance = balance
        self.observer = observer
        self._membership = membership
        self._preflight = preflight
        self._close = close
        self._stopping = threading.Event()
        self._errors: list[BaseException] = []
        self._beat_failed = False
        self._joined = False  # a heartbeat was written: leave() on the way out

    def stop(self) -> None:
        """Ask the group to shut down (thread- and signal-safe): `run()` marks this replica stopped,
        then stops every partition's relay."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        """Run until `stop()` or until a partition's relay stops on an error, which is raised."""
        threads: list[threading.Thread] = []
        try:
            try:
                self._preflight()
                self._beat()  # the target is known before any relay tries a lease
            except Exception as exc:
                self.observer.stopped(exc)
                if isinstance(exc, RelayError):
                    exc.logged = True
                raise
            log.info("relay %s in the group of %s with %d partitions", self.settings.instance_id,
                     self.settings.namespace, self.settings.partitions)
            for partition, relay in self.relays:
                thread = threading.Thread(target=self._run_relay, args=(relay,), daemon=True,
                                          name=f"relay-{partition.index}")
                thread.start()
                threads.append(thread)
            while not self._stopping.wait(self.settings.standby_poll_s):
                self._beat()
        finally:
            if self._joined:
                self._membership.leave()
            for _, relay in self.relays:
                relay.stop()
            for thread in threads:
                thread.join()
            self._close()
        if self._errors:
            raise self._errors[0]

    def _run_relay(self, relay: Relay) -> None:
        try:
            relay.run()
        except BaseException as exc:  # noqa: BLE001 - the group stops and raises it
            self._errors.append(exc)
            self._stopping.set()

    def _beat(self) -> None:
        """Heartbeat, then this replica's target from the live replicas (kept on a failed read)."""
        leading = self.balance.leading()
        try:
            live = self._membership.heartbeat(leading)
        except PyMongoError as exc:
            if not self._beat_failed:
                log.warning("group heartbeat failed (keeping the current share): %s", exc)
            self._beat_failed = True
        else:
            if self._beat_failed:
                log.info("group heartbeat recovered")
            self._beat_failed, self._joined = False, True
            target = target_of(self.settings.instance_id, live, self.settings.partitions)
            if target != self.balance.target:
                log.info("share: %d of %d partitions (%d live replicas)", target, self.settings.partitions,
                         len(set(live) | {self.settings.instance_id}))
            self.balance.set_target(target)
        self.observer.tick(len(leading), self.balance.target)

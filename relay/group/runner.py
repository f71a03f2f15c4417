"""A relay process: one replica of the group publishing a set of outboxes.

A process runs one `relay.core.loop.Relay` per scope (an outbox in one partition of it, with its
own lease), each in its own thread with its own producer; the change streams are the process's,
one per database, shared by the loops that lead (relay.mongo.shared_reader). `Relay` keeps the order of
steps; this module only decides, through each relay's `Assignment`, whether it should try its
lease and whether it should hand it over at its next batch boundary (relay.group.balance).

The coordinator (`Group.run`'s own loop) writes this replica's heartbeat every
RELAY_STANDBY_POLL_S, reads the live replicas, and sets the target. Shutdown order, on `stop()`:
mark this replica stopped (the others take its share at once), stop every relay (each finishes
its parcels in flight, stores its final checkpoint and releases its lease), close the streams and the
client. A relay that stops on an error stops the group the same way, and `run()` raises that
error (the process exits with its code).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from relay.core.errors import RelayError, ServerError
from relay.core.loop import Relay
from relay.core.partitions import Scope
from relay.group.balance import Balance
from relay.group.config import GroupConfig
from relay.ops.observe import ProcessObserver

log = logging.getLogger("relay")


class Membership(Protocol):
    """This replica's heartbeat in its group (relay.mongo.membership.Membership)."""

    def heartbeat(self, leading: Sequence[int]) -> list[str]:
        """Record that this replica leads `leading`; the live replicas' instance ids. Raises
        ServerError when the store does not answer."""

    def leave(self) -> None:
        """Mark this replica stopped (best effort)."""


class Group:
    """Runs the relays of its scopes in this process (see the module docstring).

    `relays` are built for the scopes with the assignments of `balance` (relay.wiring.build);
    `preflight` runs first (checks, the partition count), `close` last. Has `run()`, `stop()` and
    `observer` (relay.ops.observe.ProcessObserver: its metrics `registry`, `serve()`).
    """

    def __init__(
        self,
        config: GroupConfig,
        relays: Sequence[tuple[Scope, Relay[Any]]],
        balance: Balance,
        membership: Membership,
        observer: ProcessObserver,
        preflight: Callable[[], None],
        close: Callable[[], None],
    ) -> None:
        self.config = config
        self.relays = list(relays)
        self.outboxes = tuple(dict.fromkeys(scope.namespace for scope, _ in self.relays))  # in their order
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
        then stops every relay."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        """Run until `stop()` or until a relay stops on an error, which is raised."""
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
            log.info("%s", self.config.joined(self.outboxes))
            for scope, relay in self.relays:
                thread = threading.Thread(target=self._run_relay, args=(relay,), daemon=True, name=f"relay-{scope}")
                thread.start()
                threads.append(thread)
            while not self._stopping.wait(self.config.timing.standby_poll_s):
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

    def _run_relay(self, relay: Relay[Any]) -> None:
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
        except ServerError as exc:
            if not self._beat_failed:
                log.warning("group heartbeat failed (keeping the current share): %s", exc)
            self._beat_failed = True
        else:
            if self._beat_failed:
                log.info("group heartbeat recovered")
            self._beat_failed, self._joined = False, True
            me = self.config.instance_id
            if self.balance.rebalance(me, live):
                log.info("share: %d of %d leases (%d live replicas)", self.balance.target, len(self.relays),
                         len(set(live) | {me}))  # fmt: skip
        self.observer.tick(len(leading), self.balance.target)

"""The rules and checks the loop's state machines share (tests/unit/test_loop.py for at-least-once,
tests/unit/test_exactly_once.py for exactly-once): one base, each mode adds its own rules and says
what its consumers see.

The base drives random interleavings of writes (good, malformed, refused for good by the broker),
loop passes, failed delivery reports, takeovers of the lease, history loss (the checkpoint falls
off the oplog; the relay rescans the outbox), clock jumps, graceful stops and crashes, and checks
after every step that the fakes saw no broken guarantee (tests/unit/fakes.py: no stored token
covers an unacknowledged event, the checkpoint never moves back, a stream opens only at the stored
checkpoint or for a rescan, bounded unacknowledged and stale-fenced messages). At the end, with the
faults healed, every event is delivered (published, or dead-lettered in its place) and the
checkpoint covers them all; each mode then checks what its consumers see.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from relay.config import Settings
from tests.unit.fakes import World, covered_by, outbox_document

KEYS = ["k0", "k1", "k2", "k3", "k4"]
# RELAY_CHECKPOINT_INTERVAL_MS: after every batch, within a few reads, longer than the heartbeat.
INTERVALS_MS = [0, 500, 3000]
TOPIC = "outbox.event.order"  # the topic of every event the machines write (topic template default)


class Crashed(BaseException):
    """The relay process died here (SIGKILL): nothing after this line of the loop runs."""


def write(world: World, n: int, **overrides: object) -> list[str]:
    """Write `n` events (keys in turn), returning their ids."""
    ids = []
    for _ in range(n):
        seq = len(world.outbox.changes)
        change = world.outbox.add(outbox_document(seq, KEYS[seq % len(KEYS)], **overrides))
        ids.append(change.event_id)
    return ids


def first_copies_in_commit_order(messages: list[Any], world: World) -> None:
    """The first copy of each event, per key, follows commit order (dead letters stand in place)."""
    by_key: dict[bytes, list[str]] = {}
    seen: set[str] = set()
    for m in messages:
        if m.event_id not in seen:
            seen.add(m.event_id)
            by_key.setdefault(m.key, []).append(m.event_id)
    order = {event_id: i for i, event_id in enumerate(world.outbox.event_ids())}
    for key, ids in by_key.items():
        assert ids == sorted(ids, key=order.__getitem__), f"key {key!r} out of commit order"


class RelayMachine(RuleBasedStateMachine):
    """One outbox, one relay at a time (replaced after graceful stops and crashes). Subclasses
    make the relay (`new_relay`), say which messages their consumers see (`seen`) and what they
    must hold (`check_seen`)."""

    max_depth = 3  # exactly-once mode: one transaction at a time

    def settings(self, **changes: Any) -> Settings:
        raise NotImplementedError

    def new_relay(self, settings: Settings) -> Any:
        """A handle with `.relay` (the real Relay on the fakes) and `.publishers`."""
        raise NotImplementedError

    def seen(self) -> list[Any]:
        """The messages the mode's consumers see, in log order."""
        raise NotImplementedError

    def check_seen(self, complete: bool) -> None:
        first_copies_in_commit_order(self.seen(), self.world)
        if complete:
            delivered = {m.event_id for m in self.seen()}
            assert set(self.world.outbox.event_ids()) <= delivered, "not every event was delivered"

    # ---- set-up ---------------------------------------------------------------------------------

    @initialize(seed=st.integers(0, 2**32 - 1), max_events=st.integers(1, 12), depth=st.integers(1, 3),
                max_bytes=st.sampled_from([150, 600, 4 * 1024 * 1024]), interval_ms=st.sampled_from(INTERVALS_MS))
    def start(self, seed: int, max_events: int, depth: int, max_bytes: int, interval_ms: int = 0) -> None:
        self.world = World(random.Random(seed))
        self.base = self.settings(batch_max_events=max_events, pipeline_depth=min(depth, self.max_depth),
                                  batch_max_bytes=max_bytes, on_poison="dead-letter", dead_letter_topic="dlq",
                                  on_history_lost="rescan", checkpoint_interval_ms=interval_ms)
        self.generation = 0
        self.handle = self.new_relay(self.base)

    def replace_relay(self) -> None:
        self.generation += 1
        self.handle = self.new_relay(self.base.replace(instance_id=f"A{self.generation}"))

    # ---- the outbox ---------------------------------------------------------------------------------

    @rule(n=st.integers(1, 15))
    def write(self, n: int) -> None:
        write(self.world, n)

    @rule()
    def write_malformed(self) -> None:
        """A poison event (no eventType): dead-lettered in its place."""
        write(self.world, 1, eventType=None)

    @rule(data=st.data())
    def refuse_for_good(self, data: st.DataObject) -> None:
        """The broker refuses an event not yet delivered for good (too large for its topic): its
        record batch is replayed one message per request, then it is dead-lettered."""
        waiting = [i for i in self.world.outbox.event_ids() if i not in {m.event_id for m in self.seen()}]
        if waiting:
            self.world.broker.refuse.add((TOPIC, data.draw(st.sampled_from(waiting))))

    @rule()
    def lose_history(self) -> None:
        """The stored checkpoint falls off the oplog: the next open rescans the outbox."""
        token = self.world.lease.token
        if token is not None:
            self.world.history_lost_before = covered_by(token) + 1

    # ---- the relay and its servers ---------------------------------------------------------------

    @rule(turns=st.integers(1, 4))
    def turn(self, turns: int) -> None:
        try:
            for _ in range(turns):
                self.handle.relay.turn()
        except Crashed:
            self.replace_relay()

    @rule(n=st.integers(1, 3))
    def fail_reports(self, n: int) -> None:
        self.world.broker.fail_next += n

    @rule(forced=st.booleans())
    def take_over(self, forced: bool = True) -> None:
        """Another replica takes the lease once it expired (the holder was silent for its TTL), or
        `forced` while the holder runs. A forced takeover is checked after every batch only with
        RELAY_CHECKPOINT_INTERVAL_MS=0: with an interval the holder learns at its next write, within
        one interval (tests/unit/test_coalescer.py), and may send more than one batch before."""
        forced = forced and self.base.checkpoint_interval_ms == 0
        self.world.take_over(silent_s=0.0 if forced else self.base.lease_ttl_s)

    @rule(seconds=st.floats(0.1, 6.0))
    def clock_jumps(self, seconds: float) -> None:
        self.world.clock.advance(seconds)

    @rule()
    def graceful_stop(self) -> None:
        relay = self.handle.relay
        relay.stop()
        try:
            relay.run()  # finishes the parcels in flight, stores, releases
        except Crashed:
            pass
        self.replace_relay()

    @rule()
    def crash(self) -> None:
        for publisher in self.handle.publishers:
            publisher.close()  # what was on its way may still land, without a report
        self.replace_relay()

    # ---- checks -----------------------------------------------------------------------------------

    @invariant()
    def guarantees_hold(self) -> None:
        assert not self.world.violations, self.world.violations
        self.check_seen(complete=False)

    def heal(self) -> None:
        """Stop injecting faults (subclasses stop their own too)."""
        self.world.broker.fail_next = 0
        self.world.broker.refuse.clear()
        self.world.clock.advance(10)  # any other holder's lease expires

    def teardown(self) -> None:
        if not hasattr(self, "world"):
            return
        w = self.world
        self.heal()
        for _ in range(3000):
            delivered = {m.event_id for m in self.seen()}
            if (set(w.outbox.event_ids()) <= delivered and w.lease.token is not None
                    and covered_by(w.lease.token) == len(w.outbox.changes)):
                break
            try:
                self.handle.relay.turn()
            except Crashed:
                self.replace_relay()
        else:
            raise AssertionError("the loop did not deliver every event")
        assert not w.violations, w.violations
        self.check_seen(complete=True)

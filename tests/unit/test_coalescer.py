"""The rules of the process's checkpoints (relay.core.coalescer), fast: a fake clock and an in-memory
store of several lease documents (tests/unit/fakes.py MemoryCheckpointStore)."""

from __future__ import annotations

import pytest

from relay.core.coalescer import Coalescer, LeaseByLease
from relay.core.errors import LeaseLostError
from relay.core.positions import CheckpointWrite
from tests.support.logs import captured_logs
from tests.unit.fakes import (
    FINGERPRINT,
    Clock,
    FakeDeliveryMode,
    FakeLease,
    FakeSource,
    MemoryCheckpointStore,
    World,
    covered_by,
    fake_relay,
    fake_settings,
    relay_on,
    token,
)
from tests.unit.machine import write as _write

LEASES = ("db.a", "db.b", "db.c")


def _coalescer(interval_s: float = 1.0, max_events: int | None = None) -> tuple[Coalescer, MemoryCheckpointStore, Clock]:
    store, clock = MemoryCheckpointStore(*LEASES), Clock()
    return Coalescer(store, interval_s, clock, max_events), store, clock


def _hold(c: Coalescer, store: MemoryCheckpointStore, lease_id: str, covered: int, events: int = 0) -> None:
    c.hold(CheckpointWrite(lease_id, store.grant(lease_id), token(covered), FINGERPRINT), events)


def test_the_checkpoints_of_every_scope_are_written_together_at_most_once_per_interval():
    c, store, clock = _coalescer(interval_s=1.0)
    _hold(c, store, "db.a", 1)
    assert c.write("db.a") == token(1), "nothing written yet: the first write is due at once"
    for covered in (2, 3):
        for lid in LEASES:
            _hold(c, store, lid, covered)
            c.write(lid)
        clock.advance(0.4)
    assert store.writes == [["db.a"]], "within the interval: held, not written"
    clock.advance(0.2)
    assert c.write("db.b") == token(3)
    assert store.writes == [["db.a"], ["db.a", "db.b", "db.c"]], "one write for every scope, the newest of each"
    assert [store.stored(lid) for lid in LEASES] == [token(3)] * 3
    assert c.write("db.a") == token(3) and c.write("db.a") is None, "each loop learns its stored token once"


def test_the_events_of_every_scope_together_reaching_the_count_make_the_write_due_before_the_interval():
    c, store, clock = _coalescer(interval_s=1.0, max_events=100)
    _hold(c, store, "db.a", 1, events=1)
    c.write("db.a")  # the first write is due at once
    _hold(c, store, "db.a", 41, events=40)
    _hold(c, store, "db.b", 50, events=50)
    c.write("db.b")
    assert store.writes == [["db.a"]], "90 events since the last write, 0 s: not due"
    _hold(c, store, "db.c", 10, events=10)
    assert c.write("db.c") == token(10) and store.writes[-1] == ["db.a", "db.b", "db.c"]
    _hold(c, store, "db.a", 141, events=99)
    c.write("db.a")
    assert len(store.writes) == 2, "the count starts again at each write"
    clock.advance(1.0)
    c.write("db.a")
    assert len(store.writes) == 3, "whichever comes first: the interval"


def test_the_events_of_a_failed_write_count_towards_the_next():
    c, store, _ = _coalescer(interval_s=60.0, max_events=100)
    _hold(c, store, "db.a", 1, events=1)
    c.write("db.a")
    _hold(c, store, "db.a", 101, events=100)
    store.fail_next = 1
    with pytest.raises(Exception):  # noqa: B017 - whatever the store raised
        c.write("db.a")
    assert c.write("db.a") == token(101), "still due by count: written at the next ask"


def test_an_interval_of_0_writes_after_every_batch():
    c, store, _ = _coalescer(interval_s=0.0)
    for covered in (1, 2, 3):
        _hold(c, store, "db.a", covered)
        assert c.write("db.a") == token(covered)
    assert store.writes == [["db.a"]] * 3


def test_a_lost_lease_refuses_its_own_checkpoint_only_and_its_loop_learns_it_at_its_next_call():
    c, store, clock = _coalescer(interval_s=1.0)
    c.write("db.a")
    for lid in LEASES:
        _hold(c, store, lid, 5)
    store.take_over("db.b")
    clock.advance(1)
    assert c.write("db.a") == token(5), "the write made by db.a's loop"
    assert store.stored("db.a") == store.stored("db.c") == token(5), "the others are stored by the same write"
    assert store.stored("db.b") is None
    with pytest.raises(LeaseLostError, match="db.b"):
        c.write("db.b")
    assert not c.holds("db.b")
    for lid in ("db.a", "db.c"):
        _hold(c, store, lid, 6)
    clock.advance(1)
    c.write("db.c")
    assert store.stored("db.a") == store.stored("db.c") == token(6), "the process keeps storing the others"


def test_a_loop_holding_after_its_lease_was_found_lost_learns_it_there():
    c, store, clock = _coalescer(interval_s=0.0)
    _hold(c, store, "db.a", 1)
    store.take_over("db.a")
    c.write("db.b")  # another loop's write finds db.a lost
    with pytest.raises(LeaseLostError):
        _hold(c, store, "db.a", 2)


def test_a_held_checkpoint_is_replaced_only_by_a_newer_one():
    c, store, clock = _coalescer(interval_s=5.0)
    c.write("db.a")
    _hold(c, store, "db.a", 9)
    _hold(c, store, "db.a", 7)
    clock.advance(5)
    c.write("db.a")
    assert store.stored("db.a") == token(9)


def test_a_failed_write_keeps_its_checkpoints_for_the_next_and_raises_in_the_loop_that_made_it():
    c, store, clock = _coalescer(interval_s=1.0)
    _hold(c, store, "db.a", 3)
    _hold(c, store, "db.b", 3)
    store.fail_next = 1
    with pytest.raises(ConnectionError):
        c.write("db.a")
    _hold(c, store, "db.b", 4)  # newer, while the failed write was out
    clock.advance(0.5)
    c.write("db.a")
    assert store.writes == [], "the interval counts from the failed attempt"
    clock.advance(0.5)
    c.write("db.a")
    assert store.stored("db.a") == token(3) and store.stored("db.b") == token(4)


def test_a_session_that_ends_writes_what_it_holds_at_once_or_drops_it_when_its_lease_is_lost():
    c, store, _ = _coalescer(interval_s=60.0)
    c.write("db.a")
    _hold(c, store, "db.a", 4)
    _hold(c, store, "db.b", 4)
    assert c.end("db.a", store=True) == token(4), "a graceful stop stores at once, not at the interval"
    assert store.writes == [["db.a", "db.b"]]
    _hold(c, store, "db.c", 8)
    c.end("db.c", store=False)
    assert not c.holds("db.c")
    c.end("db.b", store=True)
    assert store.stored("db.c") is None, "dropped: never written later"


def test_a_new_session_starts_with_nothing_of_the_last_one_held():
    """A checkpoint of an earlier session written after a new session read its grant would move the
    new session's stored checkpoint ahead of what it re-delivers, and then back."""
    c, store, _ = _coalescer(interval_s=60.0)
    c.write("db.a")
    _hold(c, store, "db.a", 9)
    c.begin("db.a")
    c.end("db.b", store=True)
    assert store.stored("db.a") is None


# ---- loops over one coalescer ----------------------------------------------------------------------

class _Leases:
    """A CheckpointStore over the fake lease documents of several worlds, one update each."""

    def __init__(self, leases: list[FakeLease]) -> None:
        self.leases = {lease.lease_id: lease for lease in leases}
        self.writes: list[set[str]] = []

    def store(self, checkpoints):
        self.writes.append({p.lease_id for p in checkpoints})
        return set().union(*(LeaseByLease(self.leases[p.lease_id]).store([p]) for p in checkpoints))


class _ReleaseSeen(FakeLease):
    """Records how many events the stored checkpoint covered when the lease was released."""

    covered_at_release: int | None = None

    def release(self, grant):
        self.covered_at_release = covered_by(self.world.lease.token)
        super().release(grant)


def _acked_all(world: World) -> bool:
    return set(world.outbox.event_ids()) <= world.broker.acked


def test_a_graceful_stop_stores_the_final_checkpoints_before_the_lease_is_released():
    world = World()
    settings = fake_settings(batch_max_events=100, checkpoint_interval_ms=60_000)
    lease = _ReleaseSeen(world, "A", settings.lease_ttl_s)
    relay = relay_on(world, settings, FakeDeliveryMode(world), lambda: FakeSource(world), lease)
    relay.turn()  # takes the lease, opens the stream, stores the opening token at once
    _write(world, 30)
    for _ in range(200):
        if _acked_all(world):
            break
        relay.turn()
    assert covered_by(world.lease.token) < 30, "delivered, held within the interval"
    relay.stop()
    relay.run()
    assert lease.covered_at_release == 30 and world.lease.released


def test_two_loops_of_one_process_one_losing_its_lease_the_other_keeps_storing():
    one, two = World(), World()
    two.clock = one.clock
    settings = fake_settings(batch_max_events=5, checkpoint_interval_ms=1000)
    leases = [FakeLease(w, "A", settings.lease_ttl_s) for w in (one, two)]
    leases[1].lease_id = "db.outbox2"
    store = _Leases(leases)
    coalescer = Coalescer(store, 1.0, one.clock)
    relays = [relay_on(w, settings, FakeDeliveryMode(w), lambda w=w: FakeSource(w), lease, coalescer=coalescer)
              for w, lease in zip((one, two), leases, strict=True)]
    _write(one, 20)
    _write(two, 20)
    for _ in range(100):
        for relay in relays:
            relay.turn()
    assert covered_by(one.lease.token) == covered_by(two.lease.token) == 20
    assert {"db.outbox", "db.outbox2"} in store.writes, "both checkpoints in one write"
    two.take_over(silent_s=settings.lease_ttl_s)
    two.lease.expires_at = float("inf")  # the other replica keeps it
    _write(one, 20)
    _write(two, 20)
    for _ in range(100):
        for relay in relays:
            relay.turn()
    assert covered_by(one.lease.token) == 40, "the process keeps storing the scope it still leads"
    assert covered_by(two.lease.token) == 20, "nothing stored under the lost lease"
    assert not one.violations and not two.violations


def test_a_holder_fenced_out_while_it_runs_stops_at_its_next_write_within_one_interval():
    """An operator's `checkpoint reset --force` fences a running holder: no pause made its next step
    renew first, so it learns at the next write of its checkpoint, at most one interval later (with
    an interval of 0, after the batch, as the loop machines check)."""
    world = World()
    settings = fake_settings(batch_max_events=5, checkpoint_interval_ms=2000)
    fr = fake_relay(world, settings)
    _write(world, 5)
    for _ in range(30):
        fr.relay.turn()
    world.take_over(silent_s=0.0)
    world.lease.expires_at = float("inf")
    fenced_at = world.clock.now
    with captured_logs() as logs:
        for _ in range(200):
            _write(world, 1)
            fr.relay.turn()
            world.clock.advance(0.05)  # a batch takes some time
            if "no longer current" in logs.text:
                break
        else:
            raise AssertionError("the fenced holder never learned it")
    assert world.clock.now - fenced_at <= 2.0 + 1.0, "within one interval (plus the heartbeat's renewal)"

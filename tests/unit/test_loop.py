"""The loop's rules, fast: the real `Relay` on in-memory fakes of its boundaries (tests/unit/fakes.py).

The state machine drives random interleavings of writes, loop passes, delivery reports (in order
per partition, interleaved across partitions), failed reports, takeovers of the lease, clock
jumps, graceful stops and crashes, and checks after every step what the guarantees say:
- a stored token never covers an event whose delivery report has not succeeded;
- the checkpoint never moves back; a stream is only ever opened at the stored checkpoint
  (so a failure replays from it);
- at most RELAY_BATCH_MAX_EVENTS messages are unacknowledged, and after a takeover the old
  holder sends at most that many with its stale fencing token;
and at the end, with the faults healed, every event is published, first copies in commit order
per key. The group's assignment (relay.group.runner, for partitioned outboxes) is in it too: a hand-over
asked at a batch boundary stores the final checkpoint and releases the lease, and a relay whose
assignment says no never takes the lease. The real-server tests (tests/faults, tests/integration) check the same against mongod
and Kafka.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from relay.config import Settings
from relay.core.errors import (
    HistoryLostError,
    LeaseLostError,
    PipelineMismatchError,
    PoisonEventError,
    ReopenableStreamError,
    RepeatedStreamError,
    ServerError,
    StreamInvalidatedError,
)
from tests.support.logs import captured_logs
from tests.unit.fakes import (
    FakeAssignment,
    FakeRelay,
    World,
    covered_by,
    fake_relay,
    fake_settings,
    loop_observer,
    outbox_document,
    token,
)
from tests.unit.machine import RelayMachine, first_copies_in_commit_order
from tests.unit.machine import write as _write


def _turn_until(fr: FakeRelay, done: object, turns: int = 2000) -> None:
    for _ in range(turns):
        if done():  # type: ignore[operator]
            return
        fr.relay.turn()
    raise AssertionError("the loop did not get there")


def _first_copies_in_commit_order(world: World) -> None:
    first_copies_in_commit_order(world.broker.messages(), world)


# ---- the state machine ----------------------------------------------------------------------------

class LoopMachine(RelayMachine):
    """At-least-once (tests/unit/machine.py's rules), plus the group's assignment: a hand-over asked
    at a batch boundary stores the final checkpoint and releases the lease, and a relay whose
    assignment says no never takes the lease. Consumers see the broker's log: every event at
    least once, first copies in commit order per key."""

    def settings(self, **changes: object) -> Settings:
        return fake_settings(**changes)

    def new_relay(self, settings: Settings) -> FakeRelay:
        self.assignment = FakeAssignment()
        return fake_relay(self.world, settings, assignment=self.assignment)

    def seen(self) -> list[Any]:
        return self.world.broker.messages()

    @rule()
    def hand_over(self) -> None:
        """The group asks for the lease back (balancing): at its next batch boundary the leader
        settles what is in flight, stores the final checkpoint and releases the lease."""
        w, a = self.world, self.assignment
        me = self.handle.relay.observer.config.instance_id
        holder, failing = w.lease.owner == me, w.broker.fail_next > 0 or bool(w.broker.refuse)
        before = a.handed_over
        a.release = True
        self.handle.relay.turn()
        if a.handed_over == before:
            a.release = False  # it was not leading: nothing to hand over
            return
        source = self.handle.sources[-1]
        if holder and not failing and source.closed_at is not None:
            assert w.lease.owner is None and w.lease.released, "the lease is released at once"
            assert covered_by(w.lease.token) == source.closed_at, \
                "the final checkpoint covers everything the session read"

    @rule(allow=st.booleans())
    def assign(self, allow: bool) -> None:
        """The group lets this replica try the lease, or not (above its share)."""
        self.assignment.allow = allow

    @invariant()
    def assignment_respected(self) -> None:
        assert not self.assignment.violations, self.assignment.violations

    def heal(self) -> None:
        super().heal()
        self.assignment.allow = True


TestLoopMachine = LoopMachine.TestCase
TestLoopMachine.settings = hsettings(max_examples=150, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


# ---- poison events ---------------------------------------------------------------------------------

def _bad(world: World) -> str:
    change = world.outbox.add(outbox_document(99, "k9", eventType=None))  # no eventType: malformed
    return change.event_id


def test_poison_event_stops_at_the_event_after_storing_the_ones_before_it():
    """5 good, 1 malformed, 5 good, written together: the first 5 are published and stored, then
    the relay stops naming the event; a restart stops at the same event with the same message."""
    world = World()
    settings = fake_settings(batch_max_events=100)
    before = _write(world, 5)
    bad = _bad(world)
    _write(world, 5)
    messages = []
    for generation in range(2):
        fr = fake_relay(world, settings.replace(instance_id=f"A{generation}"))
        with pytest.raises(PoisonEventError) as stopped:
            fr.relay.run()
        messages.append(str(stopped.value))
        assert stopped.value.event_id == bad and stopped.value.exit_code == 4
        assert {m.event_id for m in world.broker.messages()} == set(before)
        assert covered_by(world.lease.token) == 5, "the checkpoint is the token of the change before it"
        assert world.lease.released
    assert messages[0] == messages[1] and "field 'eventType' is missing" in messages[0]
    assert not world.violations


def test_poison_event_first_in_its_batch_stops_without_publishing_anything_new():
    world = World()
    bad = _bad(world)
    _write(world, 3)
    fr = fake_relay(world, fake_settings())
    with pytest.raises(PoisonEventError) as stopped:
        fr.relay.run()
    assert stopped.value.event_id == bad and world.broker.messages() == []


def test_dead_letter_policy_puts_the_poison_event_in_its_place_and_goes_on():
    world = World()
    settings = fake_settings(on_poison="dead-letter", dead_letter_topic="dlq")
    good = _write(world, 3)
    bad = _bad(world)
    good += _write(world, 3)
    fr = fake_relay(world, settings)
    _turn_until(fr, lambda: set(good) <= world.broker.acked and bad in world.broker.acked)
    dead = [m for m in world.broker.messages() if m.topic == "dlq"]
    assert [m.event_id for m in dead] == [bad]
    _first_copies_in_commit_order(world)
    assert not world.violations


@pytest.mark.parametrize("policy", ["stop", "dead-letter"])
def test_record_batch_refused_by_the_broker_is_replayed_one_by_one_to_name_the_event(policy):
    """The broker refuses an event for good (too large for the topic); librdkafka reports it for
    its whole record batch, so the batch is replayed one message per request."""
    world = World()
    settings = fake_settings(on_poison=policy, dead_letter_topic="dlq", batch_max_events=50)
    good = _write(world, 6)
    refused = _write(world, 1)[0]
    world.broker.refuse.add(("outbox.event.order", refused))
    good += _write(world, 6)
    fr = fake_relay(world, settings)
    if policy == "stop":
        with pytest.raises(PoisonEventError) as stopped:
            _turn_until(fr, lambda: False)
        assert stopped.value.event_id == refused and "larger than the broker accepts" in str(stopped.value)
        assert covered_by(world.lease.token) == 6, "the events before it are stored"
        assert set(good[:6]) <= world.broker.acked
    else:
        _turn_until(fr, lambda: set(good) <= world.broker.acked and refused in world.broker.acked)
        dead = [m for m in world.broker.messages() if m.topic == "dlq"]
        assert [m.event_id for m in dead] == [refused]
    assert not world.violations


# ---- the lease ---------------------------------------------------------------------------------------

def test_lost_lease_stops_publishing_and_waits_as_a_standby():
    world = World()
    ids = _write(world, 30)
    fr = fake_relay(world, fake_settings(batch_max_events=5))
    lease_held = lambda: fr.relay.observer.registry.get_sample_value("relay_lease_held", {"outbox": "app.outbox"})  # noqa: E731
    _turn_until(fr, lambda: len(world.broker.acked) >= 10)
    world.take_over()
    fenced = world.lease.fencing
    _turn_until(fr, lambda: lease_held() == 0)
    assert world.stale_sent <= 5, "at most one batch is sent with the old fencing token"
    sent = len(world.broker.messages())
    fr.relay.turn()
    assert len(world.broker.messages()) == sent and world.lease.owner == "phantom", \
        "a standby publishes nothing and does not take an unexpired lease"
    _turn_until(fr, lambda: set(ids) <= world.broker.acked)  # standby polls let the lease expire
    assert world.lease.owner == "A" and world.lease.fencing == fenced + 1
    assert any(m.fencing < fenced for m in world.broker.messages()), "earlier messages carry the old token"
    assert not world.violations


def test_hand_over_settles_what_is_in_flight_stores_the_final_checkpoint_and_releases_the_lease():
    """A group asks its leader for the lease back at a batch boundary (relay.group.runner): the parcels
    in flight are settled, their token stored, the lease released at once; then the relay waits
    as a standby until its assignment lets it try again."""
    world = World(random.Random(7))
    ids = _write(world, 40)
    assignment = FakeAssignment()
    fr = fake_relay(world, fake_settings(batch_max_events=12, pipeline_depth=3), assignment=assignment)
    _turn_until(fr, lambda: fr.publishers and fr.publishers[-1].queued > 0)
    assert assignment.held and world.lease.owner == "A"
    assignment.release = True
    fr.relay.turn()
    assert world.lease.owner is None and world.lease.released
    assert covered_by(world.lease.token) == fr.sources[-1].closed_at > 0, "the final checkpoint covers the read"
    assert not assignment.held and fr.publishers[-1].closed
    assignment.allow = False
    for _ in range(5):
        fr.relay.turn()
    assert world.lease.owner is None, "a relay its assignment holds back does not take the lease"
    assignment.allow = True
    _turn_until(fr, lambda: set(ids) <= world.broker.acked)
    assert world.lease.fencing == 2 and not world.violations
    _first_copies_in_commit_order(world)


def test_renewals_failing_for_less_than_the_ttl_leave_the_session_publishing():
    """Issue 50: a renewal that fails while the lease is provably valid does not end the session."""
    world = World()
    _write(world, 10)
    fr = fake_relay(world, fake_settings(batch_max_events=5))  # TTL 4 s, heartbeat 1 s
    _turn_until(fr, lambda: len(world.broker.acked) >= 10)
    world.lease.failing = ServerError("update failed: connection closed")
    with captured_logs() as logs:
        for _ in range(4):  # 2 s without a write: the lease stays valid 3 s after the last one
            world.clock.advance(0.5)
            _write(world, 5)
            acked = len(world.broker.acked)
            _turn_until(fr, lambda: len(world.broker.acked) > acked)
    world.lease.failing = None
    ids = _write(world, 5)
    _turn_until(fr, lambda: set(ids) <= world.broker.acked)
    assert len(fr.publishers) == 1, "one session throughout: no restart"
    assert logs.text.count("could not write the lease on db.outbox") == 1
    assert not world.violations


def test_renewals_failing_for_longer_stop_publishing_before_the_lease_expires():
    world = World()
    _write(world, 10)
    fr = fake_relay(world, fake_settings(batch_max_events=5))
    _turn_until(fr, lambda: len(world.broker.acked) >= 10)
    world.lease.failing = ServerError("update failed: connection closed")
    expires = world.lease.expires_at
    with captured_logs() as logs:
        while world.clock.now < expires + 2.0:
            world.clock.advance(0.25)
            _write(world, 2)
            for _ in range(5):
                fr.relay.turn()
    assert not world.violations, "nothing sent once the lease could have expired"
    sent_before_expiry = len(world.broker.messages())
    assert "stopped publishing 1 s before it can expire" in logs.text
    world.lease.failing = None
    ids = _write(world, 3)
    _turn_until(fr, lambda: set(ids) <= world.broker.acked)
    assert len(world.broker.messages()) > sent_before_expiry and not world.violations


def test_lease_lost_with_the_exit_policy_stops_the_relay():
    world = World()
    _write(world, 20)
    fr = fake_relay(world, fake_settings(on_lease_lost="exit", batch_max_events=5))
    _turn_until(fr, lambda: len(world.broker.acked) >= 5)
    world.take_over()
    with pytest.raises(LeaseLostError):
        _turn_until(fr, lambda: False, turns=50)


def test_graceful_stop_stores_what_is_in_flight_and_releases_the_lease():
    world = World()
    ids = _write(world, 8)
    fr = fake_relay(world, fake_settings(batch_max_events=100, pipeline_depth=2))
    fr.relay.turn()  # takes the lease, opens the stream
    fr.relay.turn()  # sends a batch
    fr.relay.stop()
    fr.relay.run()
    assert world.lease.released and world.lease.owner is None
    assert covered_by(world.lease.token) == len([i for i in ids if i in world.broker.acked])


# ---- errors that stop or restart ---------------------------------------------------------------------

class _FailingSource:
    """Raises `error` from every read (and from `open` with `on_open`)."""

    def __init__(self, error: Exception, on_open: bool = False) -> None:
        self.error, self.on_open, self.opened = error, on_open, 0

    def open(self, start: object) -> None:
        self.opened += 1
        if self.on_open:
            raise self.error

    token = None

    def next_batch(self, max_events: int) -> object:
        raise self.error

    def close(self) -> None:
        pass


def test_a_reopenable_stream_error_that_repeats_without_progress_stops_the_relay():
    world = World()
    fr = fake_relay(world, fake_settings())
    source = _FailingSource(ReopenableStreamError(280, "ChangeStreamFatalError", "fatal"))
    fr.relay._sources = lambda: source
    with pytest.raises(RepeatedStreamError, match="280"):
        fr.relay.run()
    assert source.opened == 2, "reopened once from the checkpoint before stopping"


def _stop_line(error: Exception, on_open: bool = False, **settings_changes: object) -> dict:
    world = World()
    settings = fake_settings(**settings_changes)
    with captured_logs("json") as captured:
        fr = fake_relay(world, settings, loop_observer(settings))
        fr.relay._sources = lambda: _FailingSource(error, on_open)
        with pytest.raises(type(error)):
            fr.relay.run()
    lines, errors = captured.lines(), captured.errors()
    assert len(errors) == 1, errors
    released = next(i for i, line in enumerate(lines) if "lease released" in line["message"])
    assert lines.index(errors[0]) < released, "the stop line comes before the shutdown lines"
    return errors[0]


@pytest.mark.parametrize("error, on_open, exit_code", [
    (StreamInvalidatedError("the outbox collection saw 'drop'"), False, 4),
    (PipelineMismatchError("the stored checkpoint was made by a different pipeline"), True, 4),
    (ValueError("a bug"), False, 1),
])
def test_every_stop_writes_one_structured_error_line(error, on_open, exit_code):
    line = _stop_line(error, on_open)
    assert line["error_kind"] == type(error).__name__ and line["exit_code"] == exit_code
    assert line["reason"] == str(error) and line["logger"] == "relay"


def test_the_stop_line_keeps_the_drivers_error_that_caused_the_stop():
    """The message a user reads stays short; the driver's error is the line's `cause`."""
    try:
        raise OSError("the server closed the connection")
    except OSError as driver:
        try:
            raise StreamInvalidatedError("the outbox collection saw 'drop'") from driver
        except StreamInvalidatedError as exc:
            error = exc
    line = _stop_line(error)
    assert line["reason"] == "the outbox collection saw 'drop'"
    assert line["cause"] == "OSError: the server closed the connection"


def test_the_stop_line_of_a_poison_event_names_the_event(logs):
    world = World()
    bad = _bad(world)
    captured = logs("json")
    with pytest.raises(PoisonEventError):
        fake_relay(world, fake_settings()).relay.run()
    [line] = captured.errors()
    assert line["error_kind"] == "PoisonEventError" and line["event_id"] == bad and line["exit_code"] == 4
    assert "eventType" in line["reason"]


def test_history_lost_stops_with_its_line(logs):
    world = World()
    _write(world, 3)
    world.lease.token = token(1)
    world.history_lost_before = 2
    captured = logs("json")
    with pytest.raises(HistoryLostError):
        fake_relay(world, fake_settings()).relay.run()
    [line] = captured.errors()
    assert line["error_kind"] == "HistoryLostError" and line["exit_code"] == 4


def test_window_split_groups_by_bytes_and_isolates_first():
    from relay.core.window import split

    assert split([10, 10, 10], 15) == [(2, False), (3, False)]
    assert split([10, 10, 10], 1000) == [(3, False)]
    assert split([10, 10, 10], 1000, alone=2) == [(1, True), (2, True), (3, False)]
    assert split([30], 10) == [(1, False)]
    assert split([], 10) == []


def test_a_replica_that_lost_the_lease_during_a_rescan_sends_at_most_one_more_batch():
    """Found by the state machine above: in a rescan (RELAY_ON_HISTORY_LOST=rescan) the parcels
    carry no position and store nothing, so without a lease write per batch a replica that lost
    the lease went on sending. Its steps, replayed as hypothesis printed them; the fakes count
    messages sent with a stale fencing token after the takeover (at most one batch of 1)."""
    with captured_logs():
        state = LoopMachine()
        state.start(seed=0, max_events=1, depth=1, max_bytes=150)
        steps: list[tuple[str, dict[str, Any]]] = [
            ("write_malformed", {}), ("hand_over", {}), ("crash", {}), ("hand_over", {}),
            ("lose_history", {}), ("write_malformed", {}), ("clock_jumps", {"seconds": 1.0}),
            ("clock_jumps", {"seconds": 1.5}), ("turn", {"turns": 3}), ("take_over", {}),
            ("turn", {"turns": 2}),
        ]
        for name, args in steps:
            getattr(state, name)(**args)
            state.assignment_respected()
            state.guarantees_hold()
        state.teardown()

"""Exactly-once mode's rules, fast: the real `Relay` on in-memory fakes (tests/unit/txn_fakes.py),
and the pure rules of relay.kafka.offsets_record (where to resume: tests/unit/test_resume.py).

The state machine drives writes, loop passes, failed reports, takeovers (with and without the
new leader's `init_transactions` yet), kills inside a transaction and between the Kafka commit
and the MongoDB write, graceful stops and clock jumps, and checks after every step:
- what a read_committed consumer sees holds every event at most once, first copies in commit
  order per key;
- the MongoDB checkpoint covers only committed events, never moves back, and a leader opens the
  stream right after the last committed event (or at a newer idle checkpoint);
and at the end every event is visible exactly once. The real-server tests
(tests/integration/test_exactly_once.py, tests/faults/test_exactly_once_faults.py) check the same
against Kafka and MongoDB.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from relay.config import Settings
from relay.core.errors import (
    Action,
    ConfigError,
    LeaseLostError,
    OffsetsRecordError,
    PoisonEventError,
    ProducerFencedError,
    classify,
)
from relay.core.positions import newer
from relay.kafka.offsets_record import OffsetsRecord, partition_for, transactional_id
from relay.wiring import DRIVER_ERRORS
from tests.unit.fakes import FINGERPRINT, World, covered_by, fake_settings, outbox_document, token
from tests.unit.machine import INTERVALS_MS, RelayMachine, first_copies_in_commit_order
from tests.unit.machine import write as _write
from tests.unit.txn_fakes import LEASE_ID, Crashed, TxnRelay, calm_world, txn_log, txn_relay


def eos_settings(**changes: object) -> Settings:
    return fake_settings(delivery="exactly-once", **changes)


def _visible(world: World) -> list[str]:
    return [m.event_id for m in txn_log(world).committed()]


def _turn(tr: TxnRelay, done: object, turns: int = 3000) -> None:
    for _ in range(turns):
        if done():  # type: ignore[operator]
            return
        tr.relay.turn()
    raise AssertionError("the loop did not get there")


def _exactly_once_in_commit_order(world: World, complete: bool = False) -> None:
    visible = txn_log(world).committed()
    ids = [m.event_id for m in visible]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} events visible twice to read_committed"
    first_copies_in_commit_order(visible, world)
    if complete:
        assert set(ids) == set(world.outbox.event_ids()), "not every event is visible"


# ---- the state machine ------------------------------------------------------------------------

class ExactlyOnceMachine(RelayMachine):
    """Exactly-once (tests/unit/machine.py's rules), plus takeovers with and without the new
    leader's `init_transactions` yet, and kills inside a transaction and between the Kafka commit
    and the MongoDB write. Consumers read committed: every event exactly once, in commit order
    per key. (No history loss here: a rescan re-publishes on purpose, in either mode.)"""

    max_depth = 1

    def settings(self, **changes: object) -> Settings:
        return eos_settings(**changes)

    def new_relay(self, settings: Settings) -> TxnRelay:
        return txn_relay(self.world, settings)

    def seen(self) -> list[Any]:
        return txn_log(self.world).committed()

    def check_seen(self, complete: bool) -> None:
        _exactly_once_in_commit_order(self.world, complete)

    lose_history = None  # type: ignore[assignment]

    @initialize(seed=st.integers(0, 2**32 - 1), max_events=st.integers(1, 12),
                max_bytes=st.sampled_from([150, 600, 4 * 1024 * 1024]), txn_events=st.integers(1, 40),
                txn_bytes=st.sampled_from([300, 2000, 16 * 1024 * 1024]), txn_ms=st.sampled_from([1, 100, 5000]),
                interval_ms=st.sampled_from(INTERVALS_MS), background=st.booleans())
    def start(self, seed: int, max_events: int, max_bytes: int,  # type: ignore[override]
              txn_events: int, txn_bytes: int, txn_ms: int, interval_ms: int, background: bool) -> None:
        """As the base, plus the transaction bounds: a transaction spans several reads (events
        bound 1-40 over reads of 1-12 events, bytes, a time bound the clock jumps pass), and
        commits that end in the background (seen at the next poll; reads sent meanwhile wait)."""
        self.world = World(random.Random(seed))
        txn_log(self.world).background_commits = background
        self.base = self.settings(batch_max_events=max_events, batch_max_bytes=max_bytes, on_poison="dead-letter",
                                  dead_letter_topic="dlq", on_history_lost="rescan",
                                  transaction_max_events=txn_events, transaction_max_bytes=txn_bytes,
                                  transaction_max_ms=txn_ms, checkpoint_interval_ms=interval_ms)
        self.generation = 0
        self.handle = self.new_relay(self.base)

    @rule(initialized=st.booleans(), forced=st.booleans())
    def take_over(self, initialized: bool, forced: bool) -> None:  # type: ignore[override]
        """Another replica takes the lease (expired, or `forced` as in the base); with `initialized`
        it also ran init_transactions."""
        forced = forced and self.base.checkpoint_interval_ms == 0
        self.world.take_over(silent_s=0.0 if forced else self.base.lease_ttl_s)
        if initialized:
            txn_log(self.world).epoch += 1

    @rule()
    def kill_inside_a_transaction(self) -> None:
        txn_log(self.world).crash_inside = True

    @rule()
    def kill_after_some_reads_of_an_open_transaction(self) -> None:
        """Killed as a read joins a transaction holding earlier reads: the next leader resumes
        after the last committed transaction, and nothing of the open one is visible."""
        txn_log(self.world).crash_between_reads = True

    @rule()
    def kill_between_kafka_commit_and_mongodb_write(self) -> None:
        txn_log(self.world).crash_after_commit = True

    def heal(self) -> None:
        super().heal()
        t = txn_log(self.world)
        t.crash_inside, t.crash_after_commit, t.crash_between_reads = False, False, False


TestExactlyOnceMachine = ExactlyOnceMachine.TestCase
TestExactlyOnceMachine.settings = hsettings(max_examples=120, stateful_step_count=40, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])


# ---- transactions: visibility, kills, fencing --------------------------------------------------

def test_a_transaction_killed_halfway_leaves_nothing_visible_and_the_next_leader_publishes_it_once():
    world = calm_world()
    ids = _write(world, 10)
    t = txn_log(world)
    t.crash_inside = True
    first = txn_relay(world, eos_settings(batch_max_events=10))
    with pytest.raises(Crashed):
        _turn(first, lambda: False)
    aborted = len(t.log)
    assert 0 < aborted < 10 and _visible(world) == [], "half the batch appended, none of it committed"
    world.clock.advance(10)
    second = txn_relay(world, eos_settings(batch_max_events=10, instance_id="B"))
    _turn(second, lambda: set(ids) <= set(_visible(world)))
    assert len(t.log) == 10 + aborted, "a read_uncommitted consumer sees the aborted copies too"
    _exactly_once_in_commit_order(world, complete=True)
    assert not world.violations


def test_a_leader_killed_between_its_kafka_commit_and_its_mongodb_write_is_resumed_from_the_offsets_record():
    world = calm_world()
    ids = _write(world, 10)
    t = txn_log(world)
    t.crash_after_commit = True
    first = txn_relay(world, eos_settings(batch_max_events=10))
    with pytest.raises(Crashed):
        _turn(first, lambda: False)
    assert set(_visible(world)) == set(ids) and covered_by(world.lease.token) == 0, \
        "committed in Kafka; the MongoDB checkpoint still at the opening token"
    world.clock.advance(10)
    second = txn_relay(world, eos_settings(batch_max_events=10, instance_id="B"))
    more = _write(world, 5)
    _turn(second, lambda: set(more) <= set(_visible(world)))
    assert covered_by(world.opens[-1].resume_after) == 10, "resumed after the offsets record, not the checkpoint"
    _exactly_once_in_commit_order(world, complete=True)
    assert not world.violations


def test_reads_sent_during_a_background_commit_wait_for_it_and_are_stored_only_once_committed():
    """As with the real publisher's commit thread: the loop reads on while a commit is in flight;
    those reads wait (not appended) and begin the next transaction once the commit ended, and
    the MongoDB checkpoint never covers an event a read_committed consumer cannot see."""
    world = calm_world()
    ids = _write(world, 30)
    t = txn_log(world)
    t.background_commits = True
    tr = txn_relay(world, eos_settings(batch_max_events=2, transaction_max_bytes=1))  # a commit per read
    waited = 0
    for _ in range(500):
        if set(ids) <= set(_visible(world)) and covered_by(world.lease.token) == 30:
            break
        tr.relay.turn()
        publisher = tr.publishers[-1]
        waited = max(waited, len(publisher.waiting))
        assert covered_by(world.lease.token) <= len(_visible(world)), "stored past what is committed"
    assert waited > 0, "no read waited for a commit in flight"
    _exactly_once_in_commit_order(world, complete=True)
    assert covered_by(world.lease.token) == 30
    assert not world.violations


def test_a_zombie_is_fenced_at_its_next_commit_and_goes_back_to_standby():
    """A leads; B takes the lease and runs init_transactions; A's next transaction cannot commit,
    so nothing A sends after that is visible, and A goes back to standby."""
    world = calm_world()
    _write(world, 12)
    a = txn_relay(world, eos_settings(batch_max_events=4))
    _turn(a, lambda: len(_visible(world)) >= 4)
    world.take_over("B")
    txn_log(world).epoch += 1  # B's init_transactions
    fenced_from = len(txn_log(world).log)
    _write(world, 4)
    held = lambda: a.relay.observer.registry.get_sample_value("relay_lease_held", {"outbox": "app.outbox"})  # noqa: E731
    _turn(a, lambda: held() == 0, turns=50)
    t = txn_log(world)
    late = t.log[fenced_from:]
    assert late, "A tried to publish after B's init_transactions"
    assert not any(m.txn in t.committed_txns for m in late), "none of A's later transactions committed"
    assert t.commits_by_stale_fencing == 0
    errors = a.relay.observer.registry.get_sample_value(
        "relay_errors_total", {"outbox": "app.outbox", "kind": "ProducerFencedError", "action": "standby"})
    mongo_fenced = a.relay.observer.registry.get_sample_value(
        "relay_errors_total", {"outbox": "app.outbox", "kind": "LeaseLostError", "action": "standby"})
    assert (errors or 0) + (mongo_fenced or 0) == 1, "one fenced error, then standby"
    assert not world.violations


def test_a_zombie_that_commits_before_the_new_leaders_init_is_resumed_after():
    """B took the lease but has not initialized its producer yet: A's commit still succeeds; B's
    init then reads A's record and resumes after it, so nothing is repeated."""
    world = calm_world()
    ids = _write(world, 8)
    a = txn_relay(world, eos_settings(batch_max_events=8, transaction_max_events=8))
    a.relay.turn()  # A leads, opens
    world.take_over("B")  # lease only: B has not run init_transactions
    a.relay.turn()  # A commits its transaction, then its MongoDB write is fenced
    assert set(ids) <= set(_visible(world)) and covered_by(world.lease.token) == 0
    world.clock.advance(10)
    b = txn_relay(world, eos_settings(batch_max_events=8, instance_id="B"))
    more = _write(world, 3)
    _turn(b, lambda: set(more) <= set(_visible(world)))
    _exactly_once_in_commit_order(world, complete=True)
    assert not world.violations


# ---- transactions spanning several reads ------------------------------------------------------

def test_a_transaction_spans_several_reads_up_to_its_event_bound():
    world = calm_world()
    ids = _write(world, 95)
    tr = txn_relay(world, eos_settings(batch_max_events=10, transaction_max_events=40))
    _turn(tr, lambda: set(ids) <= set(_visible(world)))
    t = txn_log(world)
    sizes = sorted(sum(1 for m in t.log if m.txn == txn) for txn in t.committed_txns)
    assert sizes == [15, 40, 40], "two full transactions of four reads, the rest once the stream was idle"
    assert len([r for txn, r in t.records if txn in t.committed_txns]) == 3, "one offsets record per transaction"
    _exactly_once_in_commit_order(world, complete=True)
    assert not world.violations


def test_an_open_transaction_commits_once_its_time_bound_passes_and_not_before():
    world = calm_world()
    first = _write(world, 10)
    tr = txn_relay(world, eos_settings(batch_max_events=10, transaction_max_ms=100))
    tr.relay.turn()  # leads, opens
    tr.relay.turn()  # reads 10: they join a new transaction
    assert _visible(world) == [] and covered_by(world.lease.token) == 0, "open: nothing visible, nothing stored"
    world.clock.advance(0.05)
    more = _write(world, 10)
    tr.relay.turn()  # another read joins it
    assert _visible(world) == []
    world.clock.advance(0.06)  # 110 ms since it began
    tr.relay.turn()
    assert _visible(world) == first + more and covered_by(world.lease.token) == 20
    assert not world.violations


def test_a_kill_after_some_reads_of_an_open_transaction_resumes_after_the_last_committed_one():
    """Two transactions of two reads commit; the third holds one read when the relay is killed as
    the next joins it. The next leader opens after the second transaction's token, the MongoDB
    checkpoint never covered the open one's reads, and each event is visible once."""
    world = calm_world()
    ids = _write(world, 50)
    t = txn_log(world)
    first = txn_relay(world, eos_settings(batch_max_events=10, transaction_max_events=20))
    _turn(first, lambda: len(_visible(world)) == 40)
    assert covered_by(world.lease.token) == 40 and covered_by(t.newest_record().token) == 40
    t.crash_between_reads = True
    _write(world, 10)
    with pytest.raises(Crashed):
        _turn(first, lambda: False)
    assert len(_visible(world)) == 40 and len(t.log) == 50, "the open transaction's read is in the log, not visible"
    assert covered_by(world.lease.token) == 40, "the checkpoint covers no read of the open transaction"
    world.clock.advance(10)
    second = txn_relay(world, eos_settings(batch_max_events=10, transaction_max_events=20, instance_id="B"))
    _turn(second, lambda: len(_visible(world)) == 60)
    assert covered_by(world.opens[-1].resume_after) == 40
    assert set(ids) <= set(_visible(world))
    _exactly_once_in_commit_order(world, complete=True)
    assert not world.violations


@pytest.mark.parametrize("setting", ["RELAY_TRANSACTION_MAX_EVENTS", "RELAY_TRANSACTION_MAX_BYTES",
                                     "RELAY_TRANSACTION_MAX_MS"])
@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_transaction_bounds_are_checked_naming_the_setting(setting, value):
    with pytest.raises(ConfigError) as err:
        Settings.load(env={"RELAY_DELIVERY": "exactly-once", setting: value})
    assert err.value.setting == setting


# ---- poison events ----------------------------------------------------------------------------

def test_a_poison_event_stops_after_the_events_before_it_committed_in_their_own_transaction():
    world = calm_world()
    before = _write(world, 5)
    bad = world.outbox.add(outbox_document(99, "k9", eventType=None)).event_id
    _write(world, 5)
    for generation in range(2):
        tr = txn_relay(world, eos_settings(batch_max_events=100, instance_id=f"A{generation}"))
        with pytest.raises(PoisonEventError) as stopped:
            tr.relay.run()
        assert stopped.value.event_id == bad
        assert _visible(world) == before, "the 5 before it, once, after a restart too"
        assert covered_by(txn_log(world).newest_record().token) == 5 == covered_by(world.lease.token)
    assert not world.violations


def test_dead_letters_are_written_inside_the_transaction_and_refused_batches_replayed_one_per_transaction():
    world = calm_world()
    settings = eos_settings(on_poison="dead-letter", dead_letter_topic="dlq", batch_max_events=50)
    good = _write(world, 4)
    malformed = world.outbox.add(outbox_document(99, "k9", eventType=None)).event_id
    good += _write(world, 3)
    refused = _write(world, 1)[0]
    world.broker.refuse.add(("outbox.event.order", refused))
    good += _write(world, 3)
    tr = txn_relay(world, settings)
    _turn(tr, lambda: set(good + [malformed, refused]) <= set(_visible(world)))
    t = txn_log(world)
    dead = [m for m in t.committed() if m.topic == "dlq"]
    assert sorted(m.event_id for m in dead) == sorted([malformed, refused])
    _exactly_once_in_commit_order(world, complete=True)
    assert not world.violations


# ---- switching modes ----------------------------------------------------------------------------

def test_switching_at_least_once_to_exactly_once_starts_from_the_mongodb_checkpoint():
    world = calm_world()
    first = _write(world, 6)
    alo = txn_relay(world, fake_settings(batch_max_events=6))
    _turn(alo, lambda: world.lease.token is not None and covered_by(world.lease.token) == 6)
    alo.relay.stop()
    alo.relay.run()
    assert txn_log(world).newest_record() is None
    later = _write(world, 4)
    eos = txn_relay(world, eos_settings(batch_max_events=6, instance_id="B"))
    _turn(eos, lambda: set(later) <= set(_visible(world)))
    assert covered_by(world.opens[-1].resume_after) == 6
    assert _visible(world) == later, "exactly-once mode publishes only what follows the checkpoint"
    assert set(first) <= world.broker.acked
    assert not world.violations


@pytest.mark.parametrize("mongodb_lags", [False, True])
def test_switching_exactly_once_to_at_least_once_resumes_after_the_offsets_record(mongodb_lags):
    """After a graceful stop both positions agree; after a kill between the Kafka commit and the
    MongoDB write the offsets record is newer, and the at-least-once leader reads it (the lease
    document says an exactly-once relay stored the checkpoint): nothing is published twice."""
    world = calm_world()
    first = _write(world, 6)
    eos = txn_relay(world, eos_settings(batch_max_events=6))
    if mongodb_lags:
        txn_log(world).crash_after_commit = True
        with pytest.raises(Crashed):
            _turn(eos, lambda: False)
        world.clock.advance(10)
    else:
        _turn(eos, lambda: covered_by(world.lease.token or token(0)) == 6)
        eos.relay.stop()
        eos.relay.run()
    assert world.lease.delivery == "exactly-once" and set(first) == set(_visible(world))
    later = _write(world, 4)
    alo = txn_relay(world, fake_settings(batch_max_events=6, instance_id="B"))
    _turn(alo, lambda: set(later) <= world.broker.acked)
    assert covered_by(world.opens[-1].resume_after) == 6
    assert sorted(m.event_id for m in world.broker.messages()) == sorted(later), "nothing of the exactly-once run again"
    assert world.lease.delivery == "at-least-once"
    assert not world.violations


def test_after_a_checkpoint_reset_the_old_offsets_record_is_forgotten():
    world = calm_world()
    _write(world, 6)
    eos = txn_relay(world, eos_settings(batch_max_events=6))
    _turn(eos, lambda: covered_by(world.lease.token or token(0)) == 6)
    eos.relay.stop()
    eos.relay.run()
    world.lease.token = None  # `outbox-relay checkpoint reset`
    world.lease.delivery = None
    again = txn_relay(world, eos_settings(batch_max_events=6, instance_id="B", start_at="oplog-start"))
    again.relay.turn()
    assert world.opens[-1].oplog_start, "RELAY_START_AT, not the offsets record"
    assert txn_log(world).newest_record() is None, "the record from before the reset is a tombstone now"


# ---- the pure rules ---------------------------------------------------------------------------------

def _record(position: int, fingerprint: str = FINGERPRINT) -> OffsetsRecord:
    return OffsetsRecord(LEASE_ID, token(position), fingerprint, 3, "A")


def test_offsets_records_round_trip_and_a_foreign_record_names_where_it_is():
    record = _record(12)
    assert OffsetsRecord.decode(LEASE_ID, record.encode(), "t[0]@3") == record
    with pytest.raises(OffsetsRecordError, match=r"t\[0\]@3.*not an outbox-relay offsets record"):
        OffsetsRecord.decode(LEASE_ID, b"hello", "t[0]@3")
    with pytest.raises(OffsetsRecordError, match="holds lease 'other.outbox'"):
        OffsetsRecord.decode(LEASE_ID, OffsetsRecord("other.outbox", token(1), "f", 1, "A").encode(), "t[0]@4")


def test_token_order_and_stable_names():
    assert newer(token(10), token(9)) and not newer(token(9), token(9))
    assert newer({"_data": "826B0450A1000000012B"}, {"_data": "826B0450A00000006C2B0229296E04"})
    assert transactional_id("app.outbox#2/4") == "outbox-relay:app.outbox#2/4"
    assert partition_for("app.outbox", 1) == 0
    assert partition_for("app.outbox", 25) == partition_for("app.outbox", 25) < 25


def test_fenced_and_abortable_kafka_errors_are_classified():
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    abortable = KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, txn_requires_abort=True))
    assert classify(fenced, DRIVER_ERRORS) is Action.FENCED
    assert classify(ProducerFencedError("x")) is Action.FENCED and issubclass(ProducerFencedError, LeaseLostError)
    assert classify(abortable, DRIVER_ERRORS) is Action.RESTART


@pytest.mark.parametrize("env, setting", [
    ({"RELAY_PIPELINE_DEPTH": "2"}, "RELAY_PIPELINE_DEPTH"),
    ({"RELAY_KAFKA_TRANSACTIONAL_ID": "mine"}, "RELAY_KAFKA_TRANSACTIONAL_ID"),
    ({"RELAY_KAFKA_TRANSACTION_TIMEOUT_MS": "1000"}, "RELAY_KAFKA_TRANSACTION_TIMEOUT_MS"),
    ({"RELAY_OFFSETS_TOPIC": "bad topic"}, "RELAY_OFFSETS_TOPIC"),
])
def test_exactly_once_settings_are_checked_naming_the_setting(env, setting):
    with pytest.raises(ConfigError) as err:
        Settings.load(env={"RELAY_DELIVERY": "exactly-once", **env})
    assert err.value.setting == setting


def test_exactly_once_defaults():
    s = Settings.load(env={"RELAY_DELIVERY": "exactly-once"})
    assert s.offsets_topic == "outbox-relay.offsets" and Settings().delivery == "at-least-once"
    assert s.parts().kafka.transaction_timeout_ms == 120000  # follows message.timeout.ms
    assert (s.transaction_max_events, s.transaction_max_bytes, s.transaction_max_ms) == (10000, 16 << 20, 100)
    assert s.parts().loop.transaction_max_events == 10000
    assert Settings.load(env={}).parts().loop.transaction_max_events is None, "at-least-once: no transaction window"

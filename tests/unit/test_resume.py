"""Where a new leading session opens the stream (relay.core.resume.resume): every row of its
table, what it reads from Kafka and when, and how the loop applies its history-lost answer."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from relay.core.errors import HistoryLostError, PipelineMismatchError
from relay.core.positions import Checkpoint, ClusterTime, StartPoint
from relay.core.resume import IfLost, Rules, Store, resume
from relay.kafka.offsets_record import OffsetsRecord
from tests.unit.fakes import FINGERPRINT, FakeLease, World, covered_by, fake_relay, fake_settings, token
from tests.unit.machine import write

TOPIC = "outbox-relay.offsets"
LEASE_ID = "app.outbox"
EOS = Rules(FINGERPRINT, "exactly-once", "oplog-start", "stop", TOPIC)
ALO = Rules(FINGERPRINT, "at-least-once", "oplog-start", "stop", TOPIC)
SEED = ClusterTime(1_767_225_600, 3)


def _record(position: int, fingerprint: str = FINGERPRINT) -> OffsetsRecord:
    return OffsetsRecord(LEASE_ID, token(position), fingerprint, 3, "A")


class _Offsets:
    """The offsets topic as the decision sees it: one record (or none), and how often it was read."""

    def __init__(self, record: OffsetsRecord | None) -> None:
        self.record, self.reads = record, 0

    def __call__(self) -> OffsetsRecord | None:
        self.reads += 1
        return self.record


def _checkpoint(position: int | None, delivery: str | None = "exactly-once", fingerprint: str | None = FINGERPRINT,
                seed: ClusterTime | None = None) -> Checkpoint:
    return Checkpoint(None if position is None else token(position), None, fingerprint, delivery, seed)


def _after(plan: Any) -> int | None:
    return None if plan.start.resume_after is None else covered_by(plan.start.resume_after)


# ---- a MongoDB checkpoint -------------------------------------------------------------------------

@pytest.mark.parametrize("mongo, kafka, expected, store", [
    (5, None, 5, Store.NOTHING),   # at-least-once so far: the MongoDB checkpoint
    (5, 7, 7, Store.RESUMED),      # MongoDB lags the last commit (a kill between the two writes)
    (7, 5, 7, Store.NOTHING),      # MongoDB is newer (idle heartbeat, or an at-least-once run in between)
    (5, 5, 5, Store.NOTHING),
])
def test_an_exactly_once_leader_resumes_after_the_newer_of_the_checkpoint_and_the_offsets_record(
        mongo, kafka, expected, store):
    offsets = _Offsets(None if kafka is None else _record(kafka))
    plan = resume(_checkpoint(mongo), offsets, EOS)
    assert (_after(plan), plan.store, plan.forget, offsets.reads) == (expected, store, None, 1)
    assert plan.if_lost is IfLost.STOP


def test_the_newer_offsets_record_is_named_with_the_checkpoint_it_passes():
    plan = resume(_checkpoint(5), _Offsets(_record(7)), EOS)
    assert plan.checkpoint == token(5) and "offsets topic's record" in plan.description


def test_an_offsets_record_of_another_pipeline_is_refused_naming_the_topic():
    with pytest.raises(PipelineMismatchError, match="RELAY_OFFSETS_TOPIC"):
        resume(_checkpoint(1), _Offsets(_record(2, "other")), EOS)


@pytest.mark.parametrize("kafka", [None, 3])
def test_a_checkpoint_of_another_pipeline_is_refused_unless_a_newer_record_is_taken(kafka):
    with pytest.raises(PipelineMismatchError, match="stored checkpoint"):
        resume(_checkpoint(5, fingerprint="other"), _Offsets(None if kafka is None else _record(kafka)), EOS)
    assert _after(resume(_checkpoint(5, fingerprint=None), _Offsets(None), EOS)) == 5, "before fingerprints: taken"


def test_at_least_once_reads_the_offsets_topic_only_after_an_exactly_once_checkpoint():
    offsets = _Offsets(_record(9))
    assert _after(resume(_checkpoint(4, "at-least-once"), offsets, ALO)) == 4 and offsets.reads == 0
    assert _after(resume(_checkpoint(4, None), offsets, ALO)) == 4 and offsets.reads == 0
    plan = resume(_checkpoint(4, "exactly-once"), offsets, ALO)
    assert (_after(plan), plan.store, offsets.reads) == (9, Store.RESUMED, 1)


@pytest.mark.parametrize("policy", ["stop", "rescan"])
def test_a_checkpoint_that_left_the_oplog_follows_relay_on_history_lost(policy):
    rules = Rules(FINGERPRINT, "at-least-once", "oplog-start", policy, TOPIC)
    assert resume(_checkpoint(4, "at-least-once"), _Offsets(None), rules).if_lost is IfLost(policy)


# ---- no MongoDB checkpoint ------------------------------------------------------------------------

@pytest.mark.parametrize("start_at, start, if_lost", [
    ("oplog-start", StartPoint(oplog_start=True), IfLost.RETRY),
    ("now", StartPoint(), IfLost.RESCAN),
    ("2026-01-01T00:00:00", StartPoint(at_time=ClusterTime(1_767_225_600, 0)), IfLost.RESCAN),
    ("2026-01-01T01:00:00+01:00", StartPoint(at_time=ClusterTime(1_767_225_600, 0)), IfLost.RESCAN),
])
def test_without_a_checkpoint_the_stream_opens_where_relay_start_at_says_and_stores_the_opening_token(
        start_at, start, if_lost):
    offsets = _Offsets(None)
    plan = resume(_checkpoint(None), offsets, Rules(FINGERPRINT, "at-least-once", start_at, "rescan", TOPIC))
    assert (plan.start, plan.if_lost, plan.store, offsets.reads) == (start, if_lost, Store.OPENING, 0)


def test_a_partitions_seed_comes_before_relay_start_at_and_a_token_before_the_seed():
    plan = resume(_checkpoint(None, seed=SEED), _Offsets(None), Rules(FINGERPRINT, "at-least-once", "now", "stop", TOPIC))
    assert (plan.start, plan.store, plan.if_lost) == (StartPoint(at_time=SEED), Store.OPENING, IfLost.STOP)
    assert _after(resume(_checkpoint(6, seed=SEED), _Offsets(None), ALO)) == 6


def test_after_a_checkpoint_reset_an_exactly_once_leader_forgets_the_record_and_starts_at_relay_start_at():
    offsets = _Offsets(_record(8, "another pipeline's: not checked, it is forgotten"))
    plan = resume(_checkpoint(None, delivery=None), offsets, EOS)
    assert plan.forget is offsets.record and plan.start == StartPoint(oplog_start=True) and offsets.reads == 1
    assert resume(_checkpoint(None), _Offsets(None), EOS).forget is None


# ---- the loop applies it ---------------------------------------------------------------------------

class _LostOnce:
    """A change source whose first open finds its point gone from the oplog."""

    def __init__(self, opens: list[StartPoint]) -> None:
        self.opens, self.token = opens, token(0)

    def open(self, start: StartPoint) -> None:
        self.opens.append(start)
        if len(self.opens) == 1:
            raise HistoryLostError("the oldest oplog entry rolled over (fake)")

    def next_batch(self, max_events: int) -> Any:
        from relay.core.change import Batch

        return Batch([], self.token)

    def ready(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass


def test_at_the_oplog_start_a_rolled_over_oldest_entry_is_a_restart_not_a_stop():
    world, opens = World(), []
    write(world, 2)
    fr = fake_relay(world, fake_settings(start_at="oplog-start", on_history_lost="stop"))
    fr.relay._sources = lambda: _LostOnce(opens)
    fr.relay.turn()
    fr.relay.turn()
    assert opens == [StartPoint(oplog_start=True)] * 2, "opened again after the restart"
    assert world.lease.token == token(0), "the opening token stored at once"


@pytest.mark.parametrize("seeded", [False, True])
def test_a_rescan_without_a_checkpoint_stores_the_opening_token_only_once_the_scan_is_delivered(seeded):
    """A start time (RELAY_START_AT, or a partition's seed) that left the oplog, with
    RELAY_ON_HISTORY_LOST=rescan: the scan's documents have no position, so the stream's opening
    token may be stored only once they are all delivered; stored before, a crash mid-scan would
    resume after it and never publish the rest."""
    world = World()
    ids = write(world, 5)
    world.history_lost_before = 1
    settings = fake_settings(start_at="now" if seeded else "2026-01-01T00:00:00", on_history_lost="rescan",
                             batch_max_events=2)
    fr = fake_relay(world, settings)
    if seeded:
        fr.relay._lease = _Seeded(world, settings)
    fr.relay.turn()
    assert world.opens[-1] == "rescan" and world.lease.token is None, "nothing stored before the scan is delivered"
    for _ in range(200):
        if world.lease.token == token(5):
            break
        fr.relay.turn()
    assert set(ids) <= world.broker.acked and world.lease.token == token(5)
    assert not world.violations


class _Seeded(FakeLease):
    """A partition's lease seeded by a change of partition count (no token yet)."""

    def __init__(self, world: World, settings: Any) -> None:
        super().__init__(world, settings.instance_id, settings.lease_ttl_s)

    def try_acquire(self) -> Any:
        grant = super().try_acquire()
        if grant is None or grant.checkpoint.token is not None:
            return grant
        return dataclasses.replace(grant, checkpoint=_checkpoint(None, seed=SEED))


def test_relay_start_at_is_parsed_as_the_settings_parse_it():
    assert resume(_checkpoint(None), _Offsets(None), Rules(FINGERPRINT, "at-least-once", "2026-01-01", "stop", TOPIC)
                  ).start.at_time == ClusterTime(int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()), 0)

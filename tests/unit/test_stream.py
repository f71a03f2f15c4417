"""The shared change stream's rules (relay.mongo.shared_reader, relay.mongo.mailbox), fast: the real SharedStream and its
reader thread over a fake cursor on an in-memory oplog. (tests/integration/test_outboxes.py runs the
same against mongod.)

The oplog holds events at cluster times (t, inc); an event's token is the KeyString prefix of its
time plus a suffix, and a read's post-batch token the prefix of the next time: tokens compare as
strings in stream order, as the server's do."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, ClassVar

import pytest
from bson import Timestamp

from relay.core.change import Batch
from relay.core.errors import HistoryLostError, StreamInvalidatedError
from relay.core.namespace import Namespace
from relay.core.partitions import Partition, Scope
from relay.core.positions import ClusterTime, StartPoint, position_key
from relay.mongo.codecs import RAW_CHANGE_CODEC
from relay.mongo.cursor import Read
from relay.mongo.pipeline import StreamPlan
from relay.mongo.shared_reader import SharedStream
from relay.mongo.subscription import Subscription
from tests.changes import insert_change

A, B = Namespace("app", "a"), Namespace("app", "b")
PLAN = StreamPlan((A, B), 1, "app")  # a database's stream over two outboxes: routes 0 (a) and 1 (b)


def _token(i: int) -> dict[str, str]:
    return {"_data": position_key(ClusterTime(1000, 2 * i + 1)) + "2B02"}


class Oplog:
    """The events the fake cursors read: (raw change, time)."""

    def __init__(self) -> None:
        self.entries: list[tuple[Any, Timestamp]] = []
        self.oldest = Timestamp(1000, 0)
        self.lock = threading.Lock()

    def insert(self, outbox: Namespace, n: int = 1) -> list[str]:
        ids = []
        with self.lock:
            for _ in range(n):
                i = len(self.entries)
                event_id = f"{outbox.collection}{i}"
                change = insert_change({"_id": event_id}, _token(i), r=PLAN.outboxes.index(outbox))
                self.entries.append((change, Timestamp(1000, 2 * i + 1)))
                ids.append(event_id)
        return ids

    def drop(self, outbox: Namespace) -> None:
        import bson
        from bson.raw_bson import RawBSONDocument

        with self.lock:
            i = len(self.entries)
            doc = {"_id": _token(i), "operationType": "drop", "ns": {"db": outbox.database, "coll": outbox.collection}}
            self.entries.append((RawBSONDocument(bson.encode(doc), RAW_CHANGE_CODEC), Timestamp(1000, 2 * i + 1)))


class FakeCursor:
    """A change stream cursor over the Oplog: opens at a time, reads from there."""

    opened: ClassVar[list[Timestamp | None]] = []  # every open, across cursors (class-wide, reset per test)
    reads: ClassVar[int] = 0  # every read, across cursors

    def __init__(self, oplog: Oplog, fail: list[BaseException]) -> None:
        self.oplog, self.fail, self.at, self.alive = oplog, fail, 0, True

    def open(self, at: Timestamp | None) -> dict[str, str]:
        FakeCursor.opened.append(at)
        with self.oplog.lock:
            n = len(self.oplog.entries)
            self.at = n if at is None else next((i for i, (_, ts) in enumerate(self.oplog.entries) if ts >= at), n)
            return {"_data": position_key(ClusterTime(1000, 2 * self.at))}

    def read(self, max_events: int, await_ms: int | None = None) -> Read:
        FakeCursor.reads += 1
        if self.fail and (error := self.fail.pop(0)) is not None:  # None: this read succeeds
            raise error
        with self.oplog.lock:
            if self.oplog.entries and self.at < len(self.oplog.entries) and self.oplog.entries[self.at][1] < self.oplog.oldest:
                from pymongo.errors import OperationFailure

                raise OperationFailure("history lost", 286)
            chunk = self.oplog.entries[self.at : self.at + max_events]
            self.at += len(chunk)
            token = {"_data": position_key(ClusterTime(1000, 2 * self.at))}
        if not chunk:
            time.sleep(0.005)
        return Read([bytes(c.raw) for c, _ in chunk], token)  # as relay.mongo.cursor reads them

    def close(self) -> None:
        self.alive = False


@pytest.fixture
def world():
    oplog, fail = Oplog(), []  # fail: what the next reads raise, in turn (None: that read succeeds)
    FakeCursor.opened = []
    stream = SharedStream(PLAN, lambda: FakeCursor(oplog, fail), 10, 0.05, lambda: oplog.oldest)
    yield oplog, fail, stream
    stream.close()


def _subscription(stream: SharedStream, outbox: Namespace) -> Subscription:
    return Subscription(stream, Scope(outbox), lambda: iter(()))


def _until_raises(sub: Subscription) -> None:
    for _ in range(50):
        sub.next_batch(100)


def _drain(sub: Subscription, want: int, max_events: int = 100, rounds: int = 200) -> tuple[list[str], list[Batch]]:
    ids: list[str] = []
    batches: list[Batch] = []
    for _ in range(rounds):
        batch = sub.next_batch(max_events)
        batches.append(batch)
        ids += [c.event_id for c in batch.changes]
        if len(ids) >= want:
            break
    return ids, batches


def _covers(batches: list[Batch]) -> None:
    """Every batch's token covers its changes (is at or after the last one's own token)."""
    for b in batches:
        if b.changes:
            assert b.token is not None and b.token["_data"] >= b.changes[-1].position["_data"], b


def test_each_member_gets_its_own_events_in_order_under_tokens_that_cover_them(world):
    oplog, _, stream = world
    a, b = _subscription(stream, A), _subscription(stream, B)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    b.open(StartPoint(at_time=ClusterTime(1000, 0)))
    wrote_a, wrote_b = [], []
    for _ in range(5):
        wrote_a += oplog.insert(A, 3)
        wrote_b += oplog.insert(B, 2)
    got_a, batches_a = _drain(a, len(wrote_a))
    got_b, batches_b = _drain(b, len(wrote_b))
    assert got_a == wrote_a and got_b == wrote_b
    _covers(batches_a)
    _covers(batches_b)
    idle = a.next_batch(100)
    assert not idle.changes and idle.token is not None
    assert idle.token["_data"] > batches_a[-1].changes[-1].position["_data"] if batches_a[-1].changes else True
    assert len(FakeCursor.opened) == 1, "one cursor served both outboxes"


def test_a_batch_cut_to_the_room_left_carries_its_last_events_own_token(world):
    oplog, _, stream = world
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    wrote = oplog.insert(A, 8)
    first = None
    for _ in range(100):
        first = a.next_batch(3)
        if first.changes:
            break
    assert first is not None and [c.event_id for c in first.changes] == wrote[:3]
    assert first.token == first.changes[-1].position, "it covers the three it holds, nothing after"
    rest, _ = _drain(a, 5)
    assert rest == wrote[3:]


def _read_past(stream: SharedStream, n: int) -> None:
    """Wait until the reader has read the oplog's first `n` entries."""
    want = position_key(ClusterTime(1000, 2 * n))
    deadline = time.monotonic() + 10
    while stream.read_to is None or stream.read_to["_data"] < want:
        assert time.monotonic() < deadline, "the reader did not read on"
        time.sleep(0.005)


def test_caught_up_the_reader_stays_one_read_ahead_of_a_loop_that_has_not_taken(world):
    """At low rates a getMore returns at the first new event: a reader reading on would cost one
    getMore per event. Caught up, it reads again only once the loop took what it was handed, and
    that read returns everything written meanwhile, as one batch."""
    oplog, _, stream = world
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    first = oplog.insert(A, 1)
    _read_past(stream, len(oplog.entries))  # a holds one event it has not taken
    later: list[str] = []
    for _ in range(3):  # three writes while the loop delivers
        later += oplog.insert(A, 1)
        time.sleep(0.02)
    assert stream.read_to is not None
    assert stream.read_to["_data"] < _token(1)["_data"], "no read while a's event is not taken"
    assert [c.event_id for c in a.next_batch(100).changes] == first
    got, batches = _drain(a, 3)
    assert got == later
    assert [len(b.changes) for b in batches if b.changes] == [3], "one read returned the three"


class FrozenClock:
    """The reader's monotonic clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_caught_up_the_read_after_one_with_events_lingers_and_after_an_empty_read_none_does():
    """RELAY_READ_LINGER_MS: after a read that returned events (not a full one), the next read waits
    the linger for more to gather, so what is written meanwhile is one read and one batch; after an
    empty read (an idle outbox) the next read does not wait, so a lone event is read at once. The
    reader's clock stands still here until the test moves it."""
    oplog, clock = Oplog(), FrozenClock()
    FakeCursor.opened = []
    stream = SharedStream(PLAN, lambda: FakeCursor(oplog, []), 10, 0.05, lambda: oplog.oldest, 0.02, clock)
    try:
        a = _subscription(stream, A)
        a.open(StartPoint(at_time=ClusterTime(1000, 0)))
        first = oplog.insert(A, 1)
        assert _drain(a, 1)[0] == first  # that read returned an event: the next one lingers
        read = stream.read_to
        later = oplog.insert(A, 2)
        time.sleep(0.2)  # ten lingers of real time, none of the reader's
        assert stream.read_to == read, "no read before the linger is over"
        clock.now += 0.02
        got, batches = _drain(a, 2)
        assert got == later and [len(b.changes) for b in batches if b.changes] == [2], "one read, one batch"
        reads = FakeCursor.reads
        clock.now += 0.02  # the next read is empty (the outbox is idle): no linger after it
        deadline = time.monotonic() + 10
        while FakeCursor.reads < reads + 2:  # that read and one more
            assert time.monotonic() < deadline, "the reader did not read on"
            time.sleep(0.005)
        lone = oplog.insert(A, 1)
        assert _drain(a, 1)[0] == lone, "read at once, the clock standing still"
    finally:
        stream.close()


class TickingClock:
    """A clock that moves on by `step` at every reading."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 100.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.parametrize("step", [0.01, 0.02 / 3, 0.005, 0.004])
def test_a_linger_that_ends_between_two_readings_of_the_clock_never_stalls_the_reader(step):
    """The reader decides how long to wait from one reading of its clock: had it read the clock
    twice (lingering: yes; then how long: no longer), it would wait for a notification, and none
    comes (the loops wait for events, not the reader). Found by bench.ab: a relay that stopped
    publishing at 500 events/s."""
    oplog = Oplog()
    FakeCursor.opened = []
    stream = SharedStream(PLAN, lambda: FakeCursor(oplog, []), 10, 0.05, lambda: oplog.oldest, 0.02, TickingClock(step))
    try:
        a = _subscription(stream, A)
        a.open(StartPoint(at_time=ClusterTime(1000, 0)))
        for _ in range(5):
            wrote = oplog.insert(A, 1)
            assert _drain(a, 1)[0] == wrote
    finally:
        stream.close()


def test_reads_queued_in_a_catch_up_are_taken_as_one_batch(small_reads):
    """Behind the oplog's end the reader reads ahead (full reads, up to one read's worth not taken
    per member); what queued meanwhile is one batch (as much as fits), under the last read's token."""
    oplog, stream = small_reads
    wrote = oplog.insert(A, 8)
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    _read_past(stream, 2)  # one full read: a holds two, the reader stops
    first = a.next_batch(1)  # a takes one: it holds one, the reader reads two more
    _read_past(stream, 4)
    rest = a.next_batch(100)
    assert [c.event_id for c in first.changes + rest.changes] == wrote[:4]
    assert len(rest.changes) == 3, "the rest of one read and the whole next one, in one batch"
    assert rest.token is not None and rest.token["_data"] == position_key(ClusterTime(1000, 2 * 4)), (
        "under the last read's token")
    _covers([first, rest])


def test_a_member_joining_behind_the_cursor_rewinds_it_and_the_others_see_nothing_twice(world):
    oplog, _, stream = world
    wrote_b = oplog.insert(B, 4)
    wrote_a = oplog.insert(A, 4)
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    got_a, _ = _drain(a, 4)
    assert got_a == wrote_a
    b = _subscription(stream, B)  # its checkpoint: after its first event
    b.open(StartPoint(resume_after=_token(0)))
    more_a = oplog.insert(A, 2)
    got_b, _ = _drain(b, 3)
    again_a, _ = _drain(a, 2)
    assert got_b == wrote_b[1:], "b resumes after its checkpoint"
    assert again_a == more_a, "a is not handed what it had before the rewind"
    assert len(FakeCursor.opened) == 2


@pytest.fixture
def small_reads():
    """A stream reading two events at a time: a member holding two not taken stops the reader."""
    oplog = Oplog()
    FakeCursor.opened = []
    stream = SharedStream(PLAN, lambda: FakeCursor(oplog, []), 2, 0.05, lambda: oplog.oldest)
    yield oplog, stream
    stream.close()


def test_a_rewind_for_a_member_joining_behind_never_moves_another_members_idle_token_back(small_reads):
    """After a rewind the older reads hold none of `a`'s events (it skips them), and its idle
    token stays where it was: an idle store of an older one would move its checkpoint back."""
    oplog, stream = small_reads
    oplog.insert(B, 4)
    oplog.insert(A, 16)
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    _drain(a, 16, max_events=2)
    _read_past(stream, len(oplog.entries))
    high = a.next_batch(100).token
    assert high is not None
    b = _subscription(stream, B)  # behind: the cursor opens again at b's checkpoint
    b.open(StartPoint(resume_after=_token(0)))
    for _ in range(20):  # b's queue is not taken: the reader stops among the older reads
        idle = a.next_batch(100)
        assert not idle.changes and idle.token is not None
        assert idle.token["_data"] >= high["_data"], f"idle token moved back: {idle.token} < {high}"
    assert len(FakeCursor.opened) == 2, "the rewind happened"


def test_a_member_joining_ahead_of_the_cursor_keeps_an_idle_token_at_or_after_its_checkpoint(small_reads):
    oplog, stream = small_reads
    oplog.insert(A, 10)
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))  # the cursor starts at the beginning
    _read_past(stream, 2)  # and stops there: a holds two events it has not taken
    b = _subscription(stream, B)
    b.open(StartPoint(resume_after=_token(8)))  # b's checkpoint is ahead of the cursor
    for _ in range(10):
        a.next_batch(2)
        idle = b.next_batch(100)
        assert not idle.changes and idle.token is not None
        assert idle.token["_data"] >= _token(8)["_data"], f"idle token before b's checkpoint: {idle.token}"


def test_a_member_joining_now_gets_only_later_events_and_its_opening_token_covers_nothing_it_gets(world):
    oplog, _, stream = world
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    oplog.insert(B, 3)
    deadline = time.monotonic() + 10
    while stream.read_to is None or stream.read_to["_data"] <= _token(2)["_data"]:  # read past them
        assert time.monotonic() < deadline
        a.next_batch(100)
    b = _subscription(stream, B)
    b.open(StartPoint())
    opening = b.token
    later = oplog.insert(B, 2)
    got, batches = _drain(b, 2)
    assert got == later, "now is where the shared cursor is"
    assert opening is not None
    assert all(c.position["_data"] > opening["_data"] for bt in batches for c in bt.changes)


def test_the_reader_stops_while_a_member_holds_a_full_queue(world):
    oplog, _, stream = world
    a, b = _subscription(stream, A), _subscription(stream, B)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    b.open(StartPoint(at_time=ClusterTime(1000, 0)))
    oplog.insert(A, 100)
    time.sleep(0.3)  # a takes nothing: the reader reads at most one read beyond its bound
    assert a.queued <= 2 * 10, a.queued
    got, _ = _drain(a, 100)
    assert len(got) == 100


def test_a_drop_ends_only_its_outbox_after_the_inserts_before_it(world):
    oplog, _, stream = world
    a, b = _subscription(stream, A), _subscription(stream, B)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    b.open(StartPoint(at_time=ClusterTime(1000, 0)))
    before = oplog.insert(A, 2)
    oplog.drop(A)
    oplog.insert(A, 1)
    after_b = oplog.insert(B, 2)
    got, _ = _drain(a, 2)
    assert got == before
    with pytest.raises(StreamInvalidatedError, match="app.a saw 'drop'"):
        _until_raises(a)
    got_b, _ = _drain(b, 2)
    assert got_b == after_b, "b's stream goes on"


def test_a_resumable_error_reopens_where_it_was_and_says_so_without_repeating(world):
    from pymongo.errors import AutoReconnect

    oplog, fail, stream = world
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    first = oplog.insert(A, 3)
    got, _ = _drain(a, 3)
    fail.append(AutoReconnect("lost"))
    second = oplog.insert(A, 3)
    got2, batches = _drain(a, 3)
    assert got == first and got2 == second
    assert any(bt.resumed for bt in batches) or len(FakeCursor.opened) == 2


def _resumable(n: int) -> list[BaseException | None]:
    from pymongo.errors import OperationFailure

    return [OperationFailure("injected", 6, {"errorLabels": ["ResumableChangeStreamError"]}) for _ in range(n)]


def test_recovery_bound_one_resumable_error_is_one_reopen_and_reaches_no_loop(world):
    """The bound (relay.mongo.shared_reader): a failed read reopens the cursor once, at once."""
    oplog, fail, stream = world
    a, b = _subscription(stream, A), _subscription(stream, B)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    b.open(StartPoint(at_time=ClusterTime(1000, 0)))
    opened = len(FakeCursor.opened)
    fail += _resumable(1)
    wrote_a, wrote_b = oplog.insert(A, 3), oplog.insert(B, 2)
    got_a, batches = _drain(a, 3)
    got_b, _ = _drain(b, 2)
    assert (got_a, got_b) == (wrote_a, wrote_b), "nothing lost, nothing repeated"
    assert any(bt.resumed for bt in batches), "the member is told of the resume"
    assert len(FakeCursor.opened) == opened + 1, "one reopen"


def test_recovery_bound_a_second_resumable_error_before_a_read_succeeds_reaches_every_loop(world):
    from pymongo.errors import OperationFailure

    oplog, fail, stream = world
    a, b = _subscription(stream, A), _subscription(stream, B)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    b.open(StartPoint(at_time=ClusterTime(1000, 0)))
    opened = len(FakeCursor.opened)
    fail += _resumable(2)
    for sub in (a, b):
        with pytest.raises(OperationFailure, match="injected") as raised:
            _until_raises(sub)
        assert raised.value.has_error_label("ResumableChangeStreamError"), "the error as the server gave it"
    assert len(FakeCursor.opened) == opened + 1, "exactly one reopen before the error reached the loops"
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))  # the loop's restart: it joins again
    wrote = oplog.insert(A, 2)
    got, _ = _drain(a, 2)
    assert got == wrote


def test_recovery_bound_counts_per_failed_read_a_read_that_succeeds_starts_it_over(world):
    oplog, fail, stream = world
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    opened = len(FakeCursor.opened)
    fail += [*_resumable(1), None, *_resumable(1), None, *_resumable(1)]
    wrote = oplog.insert(A, 4)
    got: list[str] = []
    deadline = time.monotonic() + 10
    while fail or len(got) < 4 or len(FakeCursor.opened) < opened + 3:  # until it met every error
        assert time.monotonic() < deadline, "the reader did not read on"
        got += [c.event_id for c in a.next_batch(100).changes]
    assert got == wrote, "three errors, each after a read that succeeded: each resumed, none reached the loop"
    assert len(FakeCursor.opened) == opened + 3


def test_a_member_that_left_holding_a_full_queue_holds_no_other_member_back(world):
    """A loop leaves by closing its mailbox; the reader drops it and reads on for the others."""
    oplog, _, stream = world
    a, b = _subscription(stream, A), _subscription(stream, B)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    b.open(StartPoint(at_time=ClusterTime(1000, 0)))
    oplog.insert(A, 40)  # a takes none: the reader stops once a's queue is full
    _read_past(stream, 10)
    a.close()
    wrote_b = oplog.insert(B, 30)
    got_b, _ = _drain(b, 30)
    assert got_b == wrote_b


def test_another_error_is_handed_to_every_member(world):
    from pymongo.errors import OperationFailure

    from relay.core.errors import ServerRefusedError

    oplog, fail, stream = world
    a, b = _subscription(stream, A), _subscription(stream, B)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    b.open(StartPoint(at_time=ClusterTime(1000, 0)))
    fail.append(OperationFailure("boom", 2))
    for sub in (a, b):
        with pytest.raises(ServerRefusedError, match=r"BadValue \(2\): boom") as refused:
            _until_raises(sub)
        assert isinstance(refused.value.__cause__, OperationFailure)


def test_a_start_older_than_the_oplog_is_history_lost_for_that_member_only(world):
    oplog, _, stream = world
    a = _subscription(stream, A)
    a.open(StartPoint(at_time=ClusterTime(1000, 0)))
    oplog.insert(B, 30)
    deadline = time.monotonic() + 10
    while stream.read_to is None or stream.read_to["_data"] <= _token(29)["_data"]:
        assert time.monotonic() < deadline
        a.next_batch(100)
    oplog.oldest = Timestamp(1000, 50)  # b's checkpoint (its first event, 1000.1) rolled off
    b = _subscription(stream, B)
    with pytest.raises(HistoryLostError):
        b.open(StartPoint(resume_after=_token(0)))
    wrote = oplog.insert(A, 2)
    got, _ = _drain(a, 2)
    assert got == wrote


def test_routes_of_a_partitioned_plan_are_outbox_times_partitions_plus_partition():
    plan = StreamPlan((A, B), 4, "app")
    assert [plan.route(Scope(B, Partition(k, 4))) for k in range(4)] == [4, 5, 6, 7]
    assert plan.routed and plan.collection is None
    single = StreamPlan((A,), 1, "app")
    assert not single.routed and single.collection == "a"
    assert single.stages("aggregateId")[0] == {"$match": {"operationType": {"$in": ["insert", "drop", "rename", "dropDatabase", "invalidate"]}}}


def test_without_partitions_the_server_routes_by_outbox_alone_and_hashes_nothing():
    """One partition: an insert's route is its outbox's index, so the stream's stages never use
    `$toHashedIndexKey` (MongoDB before 6.0 has none); with partitions they hash the aggregate id
    (relay.core.partitions.route_expression)."""
    two = StreamPlan((A, B), 1, "app")
    assert two.routed
    assert two.stages("aggregateId")[1]["$project"]["r"] == {"$indexOfArray": [["a", "b"], "$ns.coll"]}
    assert "$toHashedIndexKey" not in json.dumps(two.stages("aggregateId"))
    assert "$toHashedIndexKey" in json.dumps(StreamPlan((A, B), 2, "app").stages("aggregateId"))

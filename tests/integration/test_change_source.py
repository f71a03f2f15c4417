"""The shared change stream on a real mongod: its own aggregate and getMore commands (no driver
state), the scopes' subscriptions to it (relay.mongo.shared_reader, relay.mongo.subscription),
and its recovery bound under a `failCommand` failpoint on getMore.

A batch carries a token that covers exactly what it holds: a checkpoint stored after it resumes
at the first change it did not hold. (The mutation "cut a queued read to the room left but keep
the read's post-batch token" fails the resume check below.)
"""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from relay.config import Settings
from relay.core.namespace import Namespace
from relay.core.partitions import Scope
from relay.core.positions import StartPoint, newer
from relay.mongo.connection import mongo_client
from relay.outbox import Outbox, OutboxEvent
from relay.wiring import change_source, shared_streams
from tests.support.mongodb import change_streams, failpoint
from tests.support.waiting import wait_until


def _ids(batch) -> list[str]:
    return [c.event_id for c in batch.changes]


class Streams:
    """The process's shared streams for `settings`, on a client of the relay's kind."""

    def __init__(self, settings: Settings) -> None:
        self.parts = settings.parts()
        self.client = mongo_client(self.parts.mongo)
        self.streams = shared_streams(self.parts, self.client)

    def source(self, namespace: Namespace):
        scope = Scope(namespace)
        return change_source(self.parts, self.client, self.streams[scope.database], scope)()

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        self.client.close()


def _streams(env, **changes) -> Streams:
    return Streams(env.settings.replace(**changes))


def test_a_batch_covers_only_the_changes_it_holds(env):
    outbox = env.db[env.settings.outbox_collection]
    streams = _streams(env)
    opened = streams.source(env.namespace)
    try:
        opened.open(StartPoint())
        written = [str(i) for i in Outbox(outbox).add_many(
            OutboxEvent.new("order", f"a{i}", "Created", {"n": i}) for i in range(10))]
        first = wait_until(lambda: (b := opened.next_batch(3)).changes and b, 30, "the first changes")
        assert _ids(first) == written[:3], "a batch holds at most what was asked for"
        rest: list[str] = []
        for _ in range(20):
            rest += _ids(opened.next_batch(10))
            if len(rest) >= 7:
                break
        assert rest == written[3:], "the next batches hold the rest, in order"
    finally:
        opened.close()
        streams.close()

    # A relay that stored the first batch's token and restarted: nothing after it is skipped.
    streams = _streams(env)
    resumed = streams.source(env.namespace)
    try:
        resumed.open(StartPoint(resume_after=first.token))
        seen: list[str] = []
        for _ in range(20):
            seen += _ids(resumed.next_batch(10))
            if len(seen) >= 7:
                break
        assert seen == written[3:], "resuming after the first batch's token delivers the other 7"
    finally:
        resumed.close()
        streams.close()


def test_an_idle_stream_still_advances_its_token_and_without_a_member_holds_no_cursor(env):
    streams = _streams(env)
    source = streams.source(env.namespace)
    source.open(StartPoint())
    opening = source.token
    assert opening is not None, "the opening post-batch token is known at once"
    env.db.other.insert_one({"x": 1})  # oplog entries the outbox's stream filters out

    def open_cursors() -> int:
        return len(change_streams(env.client, [env.settings.database]))

    try:
        later = wait_until(lambda: (b := source.next_batch(10)).token != opening and b, 30,
                           "an empty read to carry a newer post-batch token")
        assert later.changes == [] and newer(later.token, opening)
        assert wait_until(lambda: open_cursors() == 1, 10, "the shared cursor")
        source.close()
        wait_until(lambda: open_cursors() == 0, 10, "the stream to release its cursor with no member left")
        source.close()  # twice is safe
    finally:
        streams.close()


def test_ready_says_whether_the_next_batch_is_queued(env):
    """Exactly-once mode asks `ready` before a read while a transaction is open."""
    outbox = env.db[env.settings.outbox_collection]
    streams = _streams(env)
    source = streams.source(env.namespace)
    try:
        source.open(StartPoint())
        assert not source.next_batch(5).changes
        assert not source.ready(0.05), "nothing queued"
        written = [str(i) for i in Outbox(outbox).add_many(
            OutboxEvent.new("order", f"r{i}", "Created", {"n": i}) for i in range(12))]
        first = wait_until(lambda: (b := source.next_batch(5)).changes and b, 30, "the first changes")
        assert source.ready(5.0), "the rest of the 12 is queued"
        taken = _ids(first) + _ids(source.next_batch(5))
        assert taken == written[:len(taken)] and len(taken) > len(first.changes), "in order"
    finally:
        source.close()
        streams.close()


def test_two_outboxes_of_one_database_share_one_cursor_each_getting_its_own_events(env):
    other = Namespace(env.settings.database, "second")
    env.db.create_collection("second")
    streams = _streams(env, outboxes=f"{env.namespace},{other}")
    first, second = streams.source(env.namespace), streams.source(other)

    try:
        first.open(StartPoint())
        second.open(StartPoint())
        a = [str(i) for i in Outbox(env.db[env.settings.outbox_collection]).add_many(
            OutboxEvent.new("order", f"a{i}", "Created", {"n": i}) for i in range(6))]
        b = [str(i) for i in Outbox(env.db.second).add_many(
            OutboxEvent.new("order", f"b{i}", "Created", {"n": i}) for i in range(4))]
        got_a: list[str] = []
        got_b: list[str] = []
        for _ in range(40):
            got_a += _ids(first.next_batch(100))
            got_b += _ids(second.next_batch(100))
            if len(got_a) >= 6 and len(got_b) >= 4:
                break
        assert got_a == a and got_b == b
        # $currentOp samples the server's cursors at one instant, which may fall between a getMore
        # and the next (seen once: none listed); sample until it lists any, then there is one.
        cursors = wait_until(lambda: change_streams(env.client, [env.settings.database]), 10, "the stream's cursor")
        assert len(cursors) == 1, f"one cursor for the database's two outboxes: {cursors}"
        assert cursors[0]["aggregate"] == 1, "the database's stream"
    finally:
        first.close()
        second.close()
        streams.close()


def _resumable_getmore_failures(env, times: int) -> failpoint:
    """The next `times` getMores of the relay's connections fail with a resumable error."""
    return failpoint(env.client, {"times": times}, failCommands=["getMore"], errorCode=6,
                     errorLabels=["ResumableChangeStreamError"])


def _add(env, prefix: str, n: int) -> list[str]:
    return [str(i) for i in Outbox(env.db[env.settings.outbox_collection]).add_many(
        OutboxEvent.new("order", f"{prefix}{i}", "Created", {"n": i}) for i in range(n))]


def test_recovery_bound_one_resumable_getmore_error_is_resumed_and_reaches_no_loop(env):
    """relay.mongo.shared_reader's bound on a real mongod: one failed getMore, one reopen, no error."""
    streams = _streams(env)
    source = streams.source(env.namespace)
    try:
        source.open(StartPoint())
        assert not source.next_batch(10).changes
        with _resumable_getmore_failures(env, 1):
            written = _add(env, "r", 5)
            got: list[str] = []
            resumed = False
            for _ in range(40):
                batch = source.next_batch(100)
                got += _ids(batch)
                resumed = resumed or batch.resumed
                if len(got) >= 5 and resumed:
                    break
        assert got == written, "nothing lost, nothing repeated"
        assert resumed, "the batch after the reopen says so"
    finally:
        source.close()
        streams.close()


def test_recovery_bound_a_second_resumable_getmore_error_reaches_the_loop(env):
    """Two failed getMores in a row (the read after the one reopen fails too): the error, as the
    server gave it, reaches the subscription; joining again from the last token loses nothing."""
    streams = _streams(env)
    source = streams.source(env.namespace)
    try:
        source.open(StartPoint())
        assert not source.next_batch(10).changes
        got: list[str] = []

        def take_until_it_raises() -> None:
            for _ in range(40):
                got.extend(_ids(source.next_batch(100)))

        with _resumable_getmore_failures(env, 2):
            written = _add(env, "s", 5)
            with pytest.raises(OperationFailure) as raised:
                take_until_it_raises()
        assert raised.value.has_error_label("ResumableChangeStreamError")
        assert source.token is not None
        source.open(StartPoint(resume_after=source.token))  # what the loop's restart does
        for _ in range(40):
            got += _ids(source.next_batch(100))
            if len(got) >= 5:
                break
        assert got == written
    finally:
        source.close()
        streams.close()

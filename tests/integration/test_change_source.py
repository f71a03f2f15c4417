"""`ChangeSource` on a real mongod: its own aggregate and getMore commands (no driver state).

A read asks the server for at most `max_events` changes and carries the server's post-batch
token, which covers exactly what that read returned: a checkpoint stored after it resumes at the
first change it did not return. (The mutation "ask for a bigger server batch and cut it to
`max_events`, keeping the post-batch token" fails the resume check below, as did its ancestor,
"always use the post-batch token" over a partly taken driver buffer.)
"""

from __future__ import annotations

from pymongo import MongoClient

from relay.core.positions import StartPoint, newer
from relay.mongo.changes import ChangeSource
from relay.outbox import Outbox, OutboxEvent
from tests.support import wait_until


def _ids(batch) -> list[str]:
    return [c.event_id for c in batch.changes]


def _source(env) -> ChangeSource:
    client: MongoClient = MongoClient(env.servers.mongodb_uri, tz_aware=True)  # the relay's kind of client
    return ChangeSource(client[env.settings.database][env.settings.outbox_collection], 200)


def test_a_read_covers_only_the_changes_it_returned(env):
    outbox = env.db[env.settings.outbox_collection]
    opened = _source(env)
    opened.open(StartPoint())
    written = [str(i) for i in Outbox(outbox).add_many(
        OutboxEvent.new("order", f"a{i}", "Created", {"n": i}) for i in range(10))]
    try:
        first = wait_until(lambda: (b := opened.next_batch(3)).changes and b, 30, "the first changes")
        assert _ids(first) == written[:3], "a read returns at most what it asked for"
        rest: list[str] = []
        for _ in range(20):  # at most 200 ms each
            rest += _ids(opened.next_batch(10))
            if len(rest) >= 7:
                break
        assert rest == written[3:], "the next reads return the rest, in order"
    finally:
        opened.close()

    # A relay that stored the first read's token and restarted: nothing after it is skipped.
    resumed = _source(env)
    resumed.open(StartPoint(resume_after=first.token))
    try:
        seen: list[str] = []
        for _ in range(20):
            seen += _ids(resumed.next_batch(10))
            if len(seen) >= 7:
                break
        assert seen == written[3:], "resuming after the first read's token delivers the other 7"
    finally:
        resumed.close()


def test_an_idle_stream_still_advances_its_token_and_a_closed_one_releases_its_cursor(env):
    source = _source(env)
    source.open(StartPoint())
    opening = source.token
    assert opening is not None, "the opening post-batch token is known at once"
    env.db.other.insert_one({"x": 1})  # oplog entries the outbox's stream filters out
    namespace = f"{env.settings.database}.{env.settings.outbox_collection}"

    def open_cursors() -> int:
        return len(list(env.client.admin.aggregate([
            {"$currentOp": {"idleCursors": True, "allUsers": True}},
            {"$match": {"type": "idleCursor", "ns": namespace}}])))

    try:
        later = wait_until(lambda: (b := source.next_batch(10)).token != opening and b, 30,
                           "an empty read to carry a newer post-batch token")
        assert later.changes == [] and newer(later.token, opening)
        assert open_cursors() == 1
    finally:
        source.close()
    assert open_cursors() == 0, "close() kills the server's cursor"
    source.close()  # twice is safe


def test_a_read_ahead_is_handed_out_whole_under_its_own_token(env):
    """After a read with changes the next getMore is already in flight; when the loop then asks
    for fewer changes than it returned, the source returns none (under the token of what it did
    return) and keeps them whole for a later read: a read-ahead is never cut."""
    outbox = env.db[env.settings.outbox_collection]
    source = _source(env)
    source.open(StartPoint())
    written = [str(i) for i in Outbox(outbox).add_many(
        OutboxEvent.new("order", f"a{i}", "Created", {"n": i}) for i in range(12))]
    try:
        first = wait_until(lambda: (b := source.next_batch(5)).changes and b, 30, "the first changes")
        assert _ids(first) == written[:len(first.changes)]
        taken = _ids(first)
        smaller = source.next_batch(2)  # the read-ahead asked for 5
        if smaller.changes:
            assert len(smaller.changes) <= 2
        else:
            assert smaller.token == first.token, "nothing handed out: the token does not move"
        taken += _ids(smaller)
        for _ in range(20):
            taken += _ids(source.next_batch(5))
            if len(taken) >= 12:
                break
        assert taken == written, "every change once, in order"
    finally:
        source.close()


def test_ready_says_whether_the_next_read_would_wait_on_mongod(env):
    """Exactly-once mode asks `ready` before a read while a transaction is open: an empty read
    leaves no read-ahead (the next getMore may wait RELAY_MAX_AWAIT_MS: not ready); a read with
    changes sends the next getMore at once, and `ready` waits for it up to its timeout."""
    outbox = env.db[env.settings.outbox_collection]
    source = _source(env)
    source.open(StartPoint())
    try:
        assert not source.next_batch(5).changes
        assert not source.ready(0.05), "no read-ahead in flight after an empty read"
        written = [str(i) for i in Outbox(outbox).add_many(
            OutboxEvent.new("order", f"r{i}", "Created", {"n": i}) for i in range(12))]
        first = wait_until(lambda: (b := source.next_batch(5)).changes and b, 30, "the first changes")
        assert source.ready(5.0), "the read-ahead (the rest of the 12) comes back at once"
        taken = _ids(first) + _ids(source.next_batch(5))
        assert taken == written[:len(taken)] and len(taken) > len(first.changes), "served from the read-ahead, in order"
    finally:
        source.close()

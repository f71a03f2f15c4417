"""`ChangeSource` on a real mongod: a read that takes part of a server batch (the rest stays in
the driver's buffer, taken raw by `_take_buffered`) must carry a token that covers only what it
took, so a checkpoint stored after it resumes at the first change it did not take."""

from __future__ import annotations

from relay.mongo.changes import ChangeSource
from relay.core.positions import StartPoint
from relay.outbox import Outbox, OutboxEvent


def _ids(batch) -> list[str]:
    return [str(c["fullDocument"]["_id"]) for c in batch.changes]


def test_a_partial_read_of_a_server_batch_covers_only_the_changes_it_took(env):
    outbox = env.db[env.settings.outbox_collection]
    opened = ChangeSource(outbox, 200, 10)  # server batches of 10
    opened.open(StartPoint())
    written = [str(i) for i in Outbox(outbox).add_many(
        OutboxEvent.new("order", f"a{i}", "Created", {"n": i}) for i in range(10))]
    try:
        first = opened.next_batch(3)  # one getMore returns all 10; 3 are taken, 7 stay buffered
        while not first.changes:
            first = opened.next_batch(3)
        assert _ids(first) == written[:3]
        rest = opened.next_batch(10)
        assert _ids(rest) == written[3:], "the buffered changes come next, in order"
    finally:
        opened.close()

    # A relay that stored the first read's token and restarted: nothing after it is skipped.
    resumed = ChangeSource(outbox, 200, 10)
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

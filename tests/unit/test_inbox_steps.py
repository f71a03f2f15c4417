"""The inbox's steps (relay.inbox.inbox.Steps) over in-memory fakes of its parts, no server: the
offsets of a batch are committed only after its transaction, duplicates never reach the handler,
and a poison event stops the batch there (`stop`) or is dead-lettered in its place (`dead-letter`).

Every fake writes to one journal, so the tests check the order of the steps across the parts.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from relay.inbox import InboxEvent
from relay.inbox.batching import plan
from relay.inbox.config import RunOptions
from relay.inbox.consumer import Received
from relay.inbox.decoding import UndecodableMessageError
from relay.inbox.inbox import Parts, Steps
from relay.inbox.metrics import InboxMetrics
from relay.inbox.poison import InboxPoisonError
from relay.inbox.store import Applied, HandlerError

AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class FakeSource:
    def __init__(self, journal, batches):
        self.journal, self.batches = journal, list(batches)

    def gather(self, limits, stop):
        return self.batches.pop(0) if self.batches else []

    def commit(self, offsets):
        self.journal.append(("commit", dict(offsets)))
        return True

    def end_offset(self, topic, partition):
        return None


class FakeDecoder:
    """The message value is the event id; b"bad" cannot be decoded."""

    def decode(self, topic, partition, offset, value, headers):
        if value == b"bad":
            raise UndecodableMessageError("not avro")
        return InboxEvent(value.decode(), "order", "agg", "Changed", {}, AT, None, topic, partition, offset)


class FakeStore:
    """The transaction: the handler's effects and the records commit together, or not at all."""

    def __init__(self, journal, recorded=()):
        self.journal, self.recorded, self.effects = journal, set(recorded), []

    def apply(self, session, events, handler):
        todo = plan(events, self.recorded)
        staged = []
        for e in todo.run:
            try:
                handler(e, session)
            except Exception as exc:
                raise HandlerError(e, exc) from exc
            staged.append(e.event_id)
        self.effects += staged
        self.recorded |= set(staged)
        self.journal.append(("transaction", staged))
        return Applied(todo.run, todo.skip, 1)

    def record_dead_letter(self, session, event_id, where):
        self.recorded.add(event_id)
        self.journal.append(("recorded dead letter", event_id))


class FakeDeadLetters:
    def __init__(self, journal):
        self.journal = journal

    def send(self, poisoned, msg):
        self.journal.append(("dead letter", poisoned.event_id or msg.value))


def msg(value: bytes, partition: int, offset: int) -> Received:
    return Received("t", partition, offset, b"k", value, [])


def steps(journal, batches, on_poison="stop", recorded=(), fail=()):
    store = FakeStore(journal, recorded)
    options = RunOptions.of(["t"], "g", "b:9092", {"on_poison": on_poison})
    dead = FakeDeadLetters(journal) if on_poison == "dead-letter" else None

    def handler(event, session):
        if event.event_id in fail:
            raise ValueError("no")

    parts = Parts(FakeSource(journal, batches), FakeDecoder(), store, dead)  # type: ignore[arg-type]
    return Steps(InboxMetrics(), threading.Event(), options, parts, handler), store


def test_offsets_are_committed_after_the_transaction_and_duplicates_never_reach_the_handler():
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"b", 0, 1), msg(b"a", 1, 5), msg(b"c", 1, 6)]  # a again: a replay
    run, store = steps(journal, [batch], recorded={"b"})
    run.step(None)
    assert journal == [("transaction", ["a", "c"]), ("commit", {("t", 0): 2, ("t", 1): 7})]
    assert run.metrics.registry.get_sample_value("relay_inbox_duplicates_skipped_total", {"topic": "t"}) == 2


def test_a_handler_error_under_stop_commits_the_events_before_it_and_nothing_after():
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"d", 1, 0), msg(b"b", 0, 1), msg(b"c", 0, 2), msg(b"e", 1, 1)]
    run, store = steps(journal, [batch], fail={"b"})
    with pytest.raises(InboxPoisonError) as stopped:
        run.step(None)
    assert (stopped.value.event_id, stopped.value.partition, stopped.value.offset) == ("b", 0, 1)
    assert journal == [("transaction", ["a", "d"]), ("commit", {("t", 0): 1, ("t", 1): 1})]
    assert store.effects == ["a", "d"]


def test_an_undecodable_message_under_stop_stops_before_anything_after_it():
    journal: list = []
    run, _ = steps(journal, [[msg(b"a", 0, 0), msg(b"bad", 2, 9), msg(b"c", 0, 1)]])
    with pytest.raises(InboxPoisonError, match="cannot decode"):
        run.step(None)
    assert journal == [("transaction", ["a"]), ("commit", {("t", 0): 1})]


def test_dead_letter_sends_the_poison_event_records_it_and_goes_on_in_order():
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"b", 0, 1), msg(b"bad", 1, 3), msg(b"c", 0, 2)]
    run, store = steps(journal, [batch], on_poison="dead-letter", fail={"b"})
    run.step(None)
    assert journal == [
        ("transaction", ["a"]), ("commit", {("t", 0): 1}),
        ("dead letter", "b"), ("recorded dead letter", "b"), ("commit", {("t", 0): 2}),
        ("dead letter", b"bad"), ("commit", {("t", 1): 4}),
        ("transaction", ["c"]), ("commit", {("t", 0): 3}),
    ]
    assert store.effects == ["a", "c"]


def test_the_summary_line_counts_what_the_batches_did(caplog):
    journal: list = []
    run, _ = steps(journal, [[msg(b"a", 0, 0), msg(b"a", 0, 1), msg(b"b", 0, 2)]])
    run.metrics.summary_every_s = 0.0
    with caplog.at_level("INFO", logger="relay.summary"):
        run.step(None)
    line = next(r for r in caplog.records if r.name == "relay.summary")
    assert (line.processed_total, line.duplicates_total, line.batches_total, line.group) == (2, 1, 1, "g")

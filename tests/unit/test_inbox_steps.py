"""The inbox's steps (relay.inbox.inbox.Steps) over in-memory fakes of its parts, no server: the
offsets of a batch are committed only after its transaction, duplicates never reach the handler,
a poison event stops the batch there (`stop`) or is dead-lettered in its place (`dead-letter`), a
transient failure (database, Schema Registry) runs the same batch again in the same order, and
`Inbox.run` closes what it opened and honours a stop asked before it began.

Every fake writes to one journal, so the tests check the order of the steps across the parts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pymongo.errors import AutoReconnect, InvalidOperation

from relay.core.errors import SchemaRegistryRefusedError, SchemaRegistryUnavailableError
from relay.inbox import Inbox, InboxEvent
from relay.inbox import inbox as inbox_module
from relay.inbox.batching import plan
from relay.inbox.config import RunOptions
from relay.inbox.consumer import Received
from relay.inbox.decoding import UndecodableMessageError
from relay.inbox.inbox import InboxParts, Steps
from relay.inbox.metrics import InboxMetrics
from relay.inbox.poison import InboxPoisonError
from relay.inbox.store import Applied, call_handler

AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class FakeSource:
    def __init__(self, journal, batches, lags=()):
        self.journal, self.batches, self.lag_reports = journal, list(batches), list(lags)

    def gather(self, limits, stop):
        return self.batches.pop(0) if self.batches else []

    def commit(self, offsets):
        if offsets:
            self.journal.append(("commit", dict(offsets)))
        return True

    def lags(self):
        return self.lag_reports.pop(0) if self.lag_reports else {}

    def close(self):
        self.journal.append(("closed", "consumer"))


class FakeDecoder:
    """The message value is the event id; b"bad" cannot be decoded; the registry fails
    `registry_failures` decode calls first (then answers)."""

    def __init__(self, registry_failures=()):
        self.registry_failures = list(registry_failures)

    def decode(self, topic, partition, offset, value, headers):
        if self.registry_failures:
            raise self.registry_failures.pop(0)
        if value == b"bad":
            raise UndecodableMessageError("not avro")
        return InboxEvent(value.decode(), "order", "agg", "Changed", {}, AT, None, topic, partition, offset)


class FakeStore:
    """The transaction: the handler's effects and the records commit together, or not at all.
    Each error in `failures` aborts one attempt after the handler ran (its effects discarded)."""

    def __init__(self, journal, recorded=(), failures=()):
        self.journal, self.recorded, self.effects = journal, set(recorded), []
        self.failures, self.handled = list(failures), []

    def apply(self, session, events, handler):
        todo = plan(events, self.recorded)
        staged = []
        for e in todo.run:
            call_handler(handler, e, session)  # the inbox's own classification of what it raises
            self.handled.append(e.event_id)
            staged.append(e.event_id)
        if self.failures:
            failure = self.failures.pop(0)
            raise failure() if callable(failure) else failure
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


def steps(journal, batches, on_poison="stop", recorded=(), fail=(), failures=(), decoder=None, lags=(),
          raises=ValueError("no")):
    store = FakeStore(journal, recorded, failures)
    options = RunOptions.of(["t"], "g", "b:9092", {"on_poison": on_poison, "retry_backoff_max_s": 0.2})
    dead = FakeDeadLetters(journal) if on_poison == "dead-letter" else None

    def handler(event, session):
        if event.event_id in fail:
            raise raises

    parts = InboxParts(FakeSource(journal, batches, lags), decoder or FakeDecoder(), store, dead)  # type: ignore[arg-type]
    return Steps(InboxMetrics(group="g"), threading.Event(), options, parts, handler), store


def sample(run, name, **labels):
    return run.metrics.registry.get_sample_value(name, {"group": "g", **labels})


def test_offsets_are_committed_after_the_transaction_and_duplicates_never_reach_the_handler():
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"b", 0, 1), msg(b"a", 1, 5), msg(b"c", 1, 6)]  # a again: a replay
    run, store = steps(journal, [batch], recorded={"b"})
    run.step(None)
    assert journal == [("transaction", ["a", "c"]), ("commit", {("t", 0): 2, ("t", 1): 7})]
    assert sample(run, "relay_inbox_duplicates_skipped_total", topic="t") == 2


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


# ---- transient failures: the same batch again, in the same order ------------------------------

def test_a_transient_database_error_reruns_the_same_events_in_order_and_applies_them_once(caplog):
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"b", 1, 0), msg(b"c", 0, 1)]
    run, store = steps(journal, [batch], failures=[AutoReconnect("connection reset"),
                                                  AutoReconnect("primary stepped down")])
    run.metrics.summary_every_s = 0.0
    with caplog.at_level("INFO", logger="relay.summary"):
        run.step(None)
    assert store.handled == ["a", "b", "c"] * 3  # each attempt ran the handler, in delivery order
    assert store.effects == ["a", "b", "c"]  # but only the committed attempt's effects remain
    assert journal == [("transaction", ["a", "b", "c"]), ("commit", {("t", 0): 2, ("t", 1): 1})]
    assert sample(run, "relay_inbox_transaction_retries_total") == 2
    line = next(r for r in caplog.records if r.name == "relay.summary")
    assert line.retries_total == 2  # the inbox's own retries count in the summary too


def test_a_handler_error_no_retry_can_fix_is_poison_even_from_pymongo():
    """InvalidOperation (a wrong or ended session) is a PyMongoError, but retrying cannot help."""
    journal: list = []
    run, store = steps(journal, [[msg(b"a", 0, 0), msg(b"b", 0, 1)]], fail={"b"},
                       raises=InvalidOperation("Can only use session with the MongoClient that started it"))
    calls, handler = [], run.handler

    def bounded(event, session):  # were it retried, it would be forever: stop after a few attempts
        calls.append(event.event_id)
        if len(calls) > 6:
            run.stop.set()
        handler(event, session)

    run.handler = bounded
    with pytest.raises(InboxPoisonError, match="InvalidOperation"):
        run.step(None)
    assert journal == [("transaction", ["a"]), ("commit", {("t", 0): 1})]
    assert sample(run, "relay_inbox_transaction_retries_total") in (None, 0)


def test_an_unreachable_schema_registry_retries_the_batch_instead_of_dead_lettering_it():
    journal: list = []
    down = [SchemaRegistryUnavailableError("cannot reach the Schema Registry: connection refused")] * 2
    batch = [msg(b"a", 0, 0), msg(b"b", 1, 0), msg(b"c", 0, 1)]
    run, store = steps(journal, [batch], on_poison="dead-letter", decoder=FakeDecoder(down))
    run.step(None)
    assert journal == [("transaction", ["a", "b", "c"]), ("commit", {("t", 0): 2, ("t", 1): 1})]
    assert store.recorded == {"a", "b", "c"}  # nothing recorded as dead-lettered
    assert sample(run, "relay_inbox_registry_retries_total") == 2
    assert sample(run, "relay_inbox_undecodable_total", topic="t") is None


def test_a_schema_registry_that_refuses_ends_the_run_without_dead_lettering_or_committing():
    journal: list = []
    refused = FakeDecoder([SchemaRegistryRefusedError("the Schema Registry refused: 401 unauthorized")])
    run, _ = steps(journal, [[msg(b"a", 0, 0)]], on_poison="dead-letter", decoder=refused)
    with pytest.raises(SchemaRegistryRefusedError):
        run.step(None)
    assert journal == []


def test_a_stop_during_a_database_outage_returns_leaving_the_batch_uncommitted():
    journal: list = []
    run, store = steps(journal, [[msg(b"a", 0, 0), msg(b"b", 0, 1)]])

    def outage():
        if len(store.handled) >= 4:  # the second attempt failed: SIGTERM arrives during the wait
            run.stop.set()
        return AutoReconnect("no primary")

    store.failures = [outage] * 100
    run.step(None)  # returns: no exception out of run
    assert journal == [] and store.effects == []
    assert sample(run, "relay_inbox_transaction_retries_total") == 1


# ---- lag ------------------------------------------------------------------------------------------

def test_lag_is_refreshed_every_step_without_commits_and_a_revoked_partition_loses_its_series():
    journal: list = []
    reports = [{("t", 0): 7, ("t", 1): 3}, {("t", 0): 9}]  # then partition 1 was revoked
    run, _ = steps(journal, [[], []], lags=reports)
    run.step(None)
    assert (sample(run, "relay_inbox_lag_messages", topic="t", partition="0"),
            sample(run, "relay_inbox_lag_messages", topic="t", partition="1")) == (7, 3)
    run.step(None)  # an idle step: nothing gathered, nothing committed
    assert journal == []
    assert sample(run, "relay_inbox_lag_messages", topic="t", partition="0") == 9
    assert sample(run, "relay_inbox_lag_messages", topic="t", partition="1") is None
    run.close()
    assert sample(run, "relay_inbox_lag_messages", topic="t", partition="0") is None


# ---- metrics on a registry the service shares --------------------------------------------------

def test_two_inboxes_and_an_inbox_run_again_share_one_registry_told_apart_by_group():
    registry = CollectorRegistry()
    first, second = Inbox(object(), registry=registry), Inbox(object(), registry=registry)  # type: ignore[arg-type]
    shipping, billing = InboxMetrics(first.registry, "shipping"), InboxMetrics(second.registry, "billing")
    event = InboxEvent("e", "order", "agg", "Changed", {}, AT, None, "t", 0, 0)
    shipping.applied([event, event], [], 1)
    billing.applied([event], [event], 2)
    again = InboxMetrics(Inbox(object(), registry=registry).registry, "shipping")  # type: ignore[arg-type]
    again.applied([event], [], 1)
    get = registry.get_sample_value
    assert get("relay_inbox_events_processed_total", {"group": "shipping", "topic": "t"}) == 3
    assert get("relay_inbox_events_processed_total", {"group": "billing", "topic": "t"}) == 1
    assert get("relay_inbox_transaction_retries_total", {"group": "billing"}) == 1
    assert b'relay_inbox_batches_total{group="shipping"} 2.0' in generate_latest(registry)


# ---- Inbox.run: what it opens, it closes; a stop before it began ---------------------------------

class FakeCollection:
    class database:
        class client:
            @staticmethod
            def start_session():
                return contextlib.nullcontext()


def _patched_run(monkeypatch, journal, source_error=None):
    class Store:
        def __init__(self, *a):
            pass

        def ensure_indexes(self):
            journal.append(("indexes", "ensured"))

    class Source(FakeSource):
        def __init__(self, options):
            if source_error is not None:
                raise source_error
            super().__init__(journal, [])

        def gather(self, limits, stop):
            journal.append(("gathered", "nothing"))
            if len(journal) > 5:
                raise AssertionError("run did not stop")
            return []

    class DeadLetters:
        def __init__(self, options):
            pass

        def close(self):
            journal.append(("closed", "dead-letter producer"))

    monkeypatch.setattr(inbox_module, "InboxStore", Store)
    monkeypatch.setattr(inbox_module, "KafkaSource", Source)
    monkeypatch.setattr(inbox_module, "DeadLetterSender", DeadLetters)
    monkeypatch.setattr(inbox_module, "EventDecoder", lambda *a: FakeDecoder())
    return Inbox(FakeCollection())  # type: ignore[arg-type]


def test_a_stop_asked_before_run_began_makes_run_return_at_once(monkeypatch):
    journal: list = []
    inbox = _patched_run(monkeypatch, journal)
    inbox.stop()
    inbox.run(lambda e, s: None, topics=["t"], group_id="g", bootstrap_servers="b:9092")
    assert ("gathered", "nothing") not in journal and ("closed", "consumer") in journal


def test_a_client_that_fails_to_open_leaves_none_of_the_others_open(monkeypatch):
    journal: list = []
    inbox = _patched_run(monkeypatch, journal, source_error=RuntimeError("no broker"))
    with pytest.raises(RuntimeError, match="no broker"):
        inbox.run(lambda e, s: None, topics=["t"], group_id="g", bootstrap_servers="b:9092", on_poison="dead-letter")
    assert journal == [("indexes", "ensured"), ("closed", "dead-letter producer")]

"""The inbox's steps over in-memory fakes of its parts, no server, in both forms: the sync inbox's
`Steps` (blocking calls) and the async inbox's `AsyncSteps` (awaits; the Kafka parts on their
thread) drive the one order of steps in relay.inbox.steps, and every scenario here runs against
both (`form`). The offsets of a batch are committed only after its transaction, duplicates never
reach the handler, a poison event stops the batch there (`stop`) or is dead-lettered in its place
(`dead-letter`), a transient failure (database, Schema Registry) runs the same batch again in the
same order, a stop during a retry wait leaves the batch uncommitted; `Inbox.run` and
`AsyncInbox.run` close what they opened (also when the task is cancelled) and honour a stop asked
before they began.

Every fake writes to one journal, so the tests check the order of the steps across the parts.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import types

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pymongo.errors import AutoReconnect, InvalidOperation

from relay.core.errors import SchemaRegistryRefusedError, SchemaRegistryUnavailableError
from relay.inbox import AsyncInbox, Inbox, InboxEvent
from relay.inbox import async_inbox as async_module
from relay.inbox import inbox as inbox_module
from relay.inbox import sources as sources_module
from relay.inbox.async_inbox import AsyncInboxParts, AsyncSteps, KafkaThread
from relay.inbox.async_store import call_async_handler
from relay.inbox.batching import plan
from relay.inbox.config import RunOptions
from relay.inbox.consumer import Received
from relay.inbox.decoding import UndecodableMessageError
from relay.inbox.inbox import InboxParts, Steps
from relay.inbox.metrics import InboxMetrics
from relay.inbox.poison import InboxPoisonError
from relay.inbox.records import Applied
from relay.inbox.stopping import StopSignal
from relay.inbox.store import call_handler

AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class FakeSource:
    def __init__(self, journal, batches, lags=()):
        self.journal, self.batches, self.lag_reports = journal, list(batches), list(lags)
        self.threads: set[str] = set()

    def gather(self, limits, stop):
        self.threads.add(threading.current_thread().name)
        return self.batches.pop(0) if self.batches else []

    def commit(self, offsets):
        self.threads.add(threading.current_thread().name)
        if offsets:
            self.journal.append(("commit", dict(offsets)))
        return True

    def lags(self):
        return self.lag_reports.pop(0) if self.lag_reports else {}

    def close(self):
        self.threads.add(threading.current_thread().name)
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
    Each error in `failures` aborts one attempt after the handler ran (its effects discarded).
    The handler is called through the inbox's own `call_handler` (its classification)."""

    def __init__(self, journal, recorded=(), failures=()):
        self.journal, self.recorded, self.effects = journal, set(recorded), []
        self.failures, self.handled = list(failures), []

    def apply(self, session, events, handler):
        todo = plan(events, self.recorded)
        for e in todo.run:
            call_handler(handler, e, session)
            self.handled.append(e.event_id)
        return self._end(todo)

    def _end(self, todo):
        staged = [e.event_id for e in todo.run]
        if self.failures:
            failure = self.failures.pop(0)
            raise failure() if callable(failure) else failure
        self.effects += staged
        self.recorded |= set(staged)
        self.journal.append(("transaction", staged))
        return Applied(todo.run, todo.skip, 1)

    def record_dead_letter(self, session, event_id, where, event=None):
        self.recorded.add(event_id)
        self.journal.append(("recorded dead letter", event_id))


class AsyncFakeStore(FakeStore):
    """FakeStore awaited, the handler through the async inbox's `call_async_handler`."""

    async def apply(self, session, events, handler):
        todo = plan(events, self.recorded)
        for e in todo.run:
            await call_async_handler(handler, e, session)
            self.handled.append(e.event_id)
        return self._end(todo)

    async def record_dead_letter(self, session, event_id, where, event=None):
        super().record_dead_letter(session, event_id, where, event)


class FakeDeadLetters:
    def __init__(self, journal):
        self.journal = journal

    def send(self, poisoned, msg):
        self.journal.append(("dead letter", poisoned.event_id or msg.value))


def msg(value: bytes, partition: int, offset: int) -> Received:
    return Received("t", partition, offset, b"k", value, [])


class Run:
    """One form's steps, stepped the same way in a test: `step()`, `close()`, `stop`, `metrics`,
    `handler` (set it with `use(fn)`, fn(event) a plain function: wrapped for the form)."""

    def __init__(self, form, steps, kafka=None):
        self.form, self.steps, self.kafka = form, steps, kafka
        self.metrics, self.stop = steps.metrics, steps.stop

    def step(self):
        if self.form == "sync":
            self.steps.step(None)
        else:
            asyncio.run(self.steps.step(None))

    def close(self):
        self.steps.close()
        if self.kafka is not None:
            self.kafka.shutdown()

    def use(self, fn):
        if self.form == "sync":
            self.steps.handler = lambda event, session: fn(event)
        else:
            async def handler(event, session):
                fn(event)
            self.steps.handler = handler


@pytest.fixture(params=["sync", "async"])
def form(request):
    return request.param


@pytest.fixture
def make(form):
    made: list[Run] = []

    def steps(journal, batches, on_poison="stop", recorded=(), fail=(), failures=(), decoder=None, lags=(),
              raises=ValueError("no")):
        options = RunOptions.of(["t"], "g", "b:9092", {"on_poison": on_poison, "retry_backoff_max_s": 0.2})
        dead = FakeDeadLetters(journal) if on_poison == "dead-letter" else None
        source, decoder = FakeSource(journal, batches, lags), decoder or FakeDecoder()
        metrics, stop = InboxMetrics(group="g"), StopSignal()
        if form == "sync":
            store = FakeStore(journal, recorded, failures)
            run = Run(form, Steps(metrics, stop, options, InboxParts(source, decoder, store, dead), None))  # type: ignore[arg-type]
        else:
            store, kafka = AsyncFakeStore(journal, recorded, failures), KafkaThread("g")
            parts = AsyncInboxParts(source, decoder, store, dead, kafka)  # type: ignore[arg-type]
            run = Run(form, AsyncSteps(metrics, stop, options, parts, None), kafka)  # type: ignore[arg-type]

        def handler(event):
            if event.event_id in fail:
                raise raises

        run.use(handler)
        run.source = source
        made.append(run)
        return run, store

    yield steps
    for run in made:
        if run.kafka is not None:
            run.kafka.shutdown()


def sample(run, name, **labels):
    return run.metrics.registry.get_sample_value(name, {"group": "g", **labels})


def test_offsets_are_committed_after_the_transaction_and_duplicates_never_reach_the_handler(make):
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"b", 0, 1), msg(b"a", 1, 5), msg(b"c", 1, 6)]  # a again: a replay
    run, store = make(journal, [batch], recorded={"b"})
    run.step()
    assert journal == [("transaction", ["a", "c"]), ("commit", {("t", 0): 2, ("t", 1): 7})]
    assert sample(run, "relay_inbox_duplicates_skipped_total", topic="t") == 2


def test_every_kafka_call_of_the_async_form_is_made_on_its_one_thread(make, form):
    journal: list = []
    run, _ = make(journal, [[msg(b"a", 0, 0)]])
    run.step()
    main = threading.current_thread().name
    if form == "async":  # gather and commit on the Kafka thread, never on the loop's
        assert len(run.source.threads) == 1 and run.source.threads.pop().startswith("relay-inbox-kafka-g")
    else:
        assert run.source.threads == {main}


def test_a_handler_error_under_stop_commits_the_events_before_it_and_nothing_after(make):
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"d", 1, 0), msg(b"b", 0, 1), msg(b"c", 0, 2), msg(b"e", 1, 1)]
    run, store = make(journal, [batch], fail={"b"})
    with pytest.raises(InboxPoisonError) as stopped:
        run.step()
    assert (stopped.value.event_id, stopped.value.partition, stopped.value.offset) == ("b", 0, 1)
    assert journal == [("transaction", ["a", "d"]), ("commit", {("t", 0): 1, ("t", 1): 1})]
    assert store.effects == ["a", "d"]


def test_an_undecodable_message_under_stop_stops_before_anything_after_it(make):
    journal: list = []
    run, _ = make(journal, [[msg(b"a", 0, 0), msg(b"bad", 2, 9), msg(b"c", 0, 1)]])
    with pytest.raises(InboxPoisonError, match="cannot decode"):
        run.step()
    assert journal == [("transaction", ["a"]), ("commit", {("t", 0): 1})]


def test_dead_letter_sends_the_poison_event_records_it_and_goes_on_in_order(make):
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"b", 0, 1), msg(b"bad", 1, 3), msg(b"c", 0, 2)]
    run, store = make(journal, [batch], on_poison="dead-letter", fail={"b"})
    run.step()
    assert journal == [
        ("transaction", ["a"]), ("commit", {("t", 0): 1}),
        ("dead letter", "b"), ("recorded dead letter", "b"), ("commit", {("t", 0): 2}),
        ("dead letter", b"bad"), ("commit", {("t", 1): 4}),
        ("transaction", ["c"]), ("commit", {("t", 0): 3}),
    ]
    assert store.effects == ["a", "c"]
    assert sample(run, "relay_inbox_dead_letters_total", topic="t") == 2
    assert sample(run, "relay_inbox_handler_errors_total", topic="t") == 1


def test_the_summary_line_counts_what_the_batches_did(make, caplog):
    journal: list = []
    run, _ = make(journal, [[msg(b"a", 0, 0), msg(b"a", 0, 1), msg(b"b", 0, 2)]])
    run.metrics.summary_every_s = 0.0
    with caplog.at_level("INFO", logger="relay.summary"):
        run.step()
    line = next(r for r in caplog.records if r.name == "relay.summary")
    assert (line.processed_total, line.duplicates_total, line.batches_total, line.group) == (2, 1, 1, "g")


# ---- transient failures: the same batch again, in the same order ------------------------------

def test_a_transient_database_error_reruns_the_same_events_in_order_and_applies_them_once(make, caplog):
    journal: list = []
    batch = [msg(b"a", 0, 0), msg(b"b", 1, 0), msg(b"c", 0, 1)]
    run, store = make(journal, [batch], failures=[AutoReconnect("connection reset"),
                                                 AutoReconnect("primary stepped down")])
    run.metrics.summary_every_s = 0.0
    with caplog.at_level("INFO", logger="relay.summary"):
        run.step()
    assert store.handled == ["a", "b", "c"] * 3  # each attempt ran the handler, in delivery order
    assert store.effects == ["a", "b", "c"]  # but only the committed attempt's effects remain
    assert journal == [("transaction", ["a", "b", "c"]), ("commit", {("t", 0): 2, ("t", 1): 1})]
    assert sample(run, "relay_inbox_transaction_retries_total") == 2
    line = next(r for r in caplog.records if r.name == "relay.summary")
    assert line.retries_total == 2  # the inbox's own retries count in the summary too


def test_a_transient_error_the_handler_raises_reruns_the_batch_instead_of_making_it_poison(make):
    journal: list = []
    run, store = make(journal, [[msg(b"a", 0, 0), msg(b"b", 0, 1)]])
    calls: list[str] = []

    def handler(event):
        calls.append(event.event_id)
        if calls.count("b") == 1 and event.event_id == "b":
            raise AutoReconnect("primary stepped down")  # raised by the handler's own write

    run.use(handler)
    run.step()
    assert calls == ["a", "b", "a", "b"]
    assert journal == [("transaction", ["a", "b"]), ("commit", {("t", 0): 2})]
    assert sample(run, "relay_inbox_handler_errors_total", topic="t") is None


def test_a_handler_error_no_retry_can_fix_is_poison_even_from_pymongo(make):
    """InvalidOperation (a wrong or ended session) is a PyMongoError, but retrying cannot help."""
    journal: list = []
    run, store = make(journal, [[msg(b"a", 0, 0), msg(b"b", 0, 1)]])
    calls: list[str] = []

    def bounded(event):  # were it retried, it would be forever: stop after a few attempts
        calls.append(event.event_id)
        if len(calls) > 6:
            run.stop.set()
        if event.event_id == "b":
            raise InvalidOperation("Can only use session with the MongoClient that started it")

    run.use(bounded)
    with pytest.raises(InboxPoisonError, match="InvalidOperation"):
        run.step()
    assert journal == [("transaction", ["a"]), ("commit", {("t", 0): 1})]
    assert sample(run, "relay_inbox_transaction_retries_total") in (None, 0)


def test_an_unreachable_schema_registry_retries_the_batch_instead_of_dead_lettering_it(make):
    journal: list = []
    down = [SchemaRegistryUnavailableError("cannot reach the Schema Registry: connection refused")] * 2
    batch = [msg(b"a", 0, 0), msg(b"b", 1, 0), msg(b"c", 0, 1)]
    run, store = make(journal, [batch], on_poison="dead-letter", decoder=FakeDecoder(down))
    run.step()
    assert journal == [("transaction", ["a", "b", "c"]), ("commit", {("t", 0): 2, ("t", 1): 1})]
    assert store.recorded == {"a", "b", "c"}  # nothing recorded as dead-lettered
    assert sample(run, "relay_inbox_registry_retries_total") == 2
    assert sample(run, "relay_inbox_undecodable_total", topic="t") is None


def test_a_schema_registry_that_refuses_ends_the_run_without_dead_lettering_or_committing(make):
    journal: list = []
    refused = FakeDecoder([SchemaRegistryRefusedError("the Schema Registry refused: 401 unauthorized")])
    run, _ = make(journal, [[msg(b"a", 0, 0)]], on_poison="dead-letter", decoder=refused)
    with pytest.raises(SchemaRegistryRefusedError):
        run.step()
    assert journal == []


def test_a_stop_during_a_database_outage_returns_leaving_the_batch_uncommitted(make):
    journal: list = []
    run, store = make(journal, [[msg(b"a", 0, 0), msg(b"b", 0, 1)]])

    def outage():
        if len(store.handled) >= 4:  # the second attempt failed: SIGTERM arrives during the wait
            run.stop.set()
        return AutoReconnect("no primary")

    store.failures = [outage] * 100
    run.step()  # returns: no exception out of run
    assert journal == [] and store.effects == []
    assert sample(run, "relay_inbox_transaction_retries_total") == 1


def test_a_stop_asked_during_a_retry_wait_ends_the_wait(make, form):
    """The wait is up to 0.2 s here (retry_backoff_max_s): the stop, asked from another thread
    as a signal handler or a service would, ends it before the next attempt runs."""
    journal: list = []
    run, store = make(journal, [[msg(b"a", 0, 0)]])
    store.failures = [AutoReconnect("no primary")] * 100

    def handler(event):
        if len(store.handled) == 3:  # the fourth attempt is running: stop from elsewhere
            threading.Thread(target=run.stop.set).start()

    run.use(handler)
    run.step()
    assert len(store.handled) <= 5 and journal == []


# ---- lag ------------------------------------------------------------------------------------------

def test_lag_is_refreshed_every_step_without_commits_and_a_revoked_partition_loses_its_series(make):
    journal: list = []
    reports = [{("t", 0): 7, ("t", 1): 3}, {("t", 0): 9}]  # then partition 1 was revoked
    run, _ = make(journal, [[], []], lags=reports)
    run.step()
    assert (sample(run, "relay_inbox_lag_messages", topic="t", partition="0"),
            sample(run, "relay_inbox_lag_messages", topic="t", partition="1")) == (7, 3)
    run.step()  # an idle step: nothing gathered, nothing committed
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
    again = InboxMetrics(AsyncInbox(AsyncFakeCollection(), registry=registry).registry, "shipping")
    again.applied([event], [], 1)
    get = registry.get_sample_value
    assert get("relay_inbox_events_processed_total", {"group": "shipping", "topic": "t"}) == 3
    assert get("relay_inbox_events_processed_total", {"group": "billing", "topic": "t"}) == 1
    assert get("relay_inbox_transaction_retries_total", {"group": "billing"}) == 1
    assert b'relay_inbox_batches_total{group="shipping"} 2.0' in generate_latest(registry)


# ---- Inbox.run and AsyncInbox.run: what they open, they close; a stop before they began --------

class FakeSession:
    def __init__(self, journal):
        self.journal = journal

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.journal.append(("ended", "session"))

    async def end_session(self):
        self.journal.append(("ended", "session"))


class FakeCollection:
    def __init__(self, journal=None):
        self.database = types.SimpleNamespace(client=types.SimpleNamespace(start_session=lambda: FakeSession(journal)))


class AsyncFakeCollection(FakeCollection):
    async def insert_one(self, doc, session=None):  # what makes it an asyncio collection
        raise AssertionError("not written by these tests")


def _patched(monkeypatch, journal, form, source_error=None, gather=None):
    class Store:
        def __init__(self, *a):
            pass

        def ensure_indexes(self):
            journal.append(("indexes", "ensured"))

    class AsyncStore(Store):
        async def ensure_indexes(self):
            super().ensure_indexes()

    class Source(FakeSource):
        def __init__(self, options):
            if source_error is not None:
                raise source_error
            super().__init__(journal, [])

        def gather(self, limits, stop):
            if gather is not None:
                return gather(stop)
            journal.append(("gathered", "nothing"))
            if len(journal) > 5:
                raise AssertionError("run did not stop")
            return []

    class DeadLetters:
        def __init__(self, options):
            pass

        def close(self):
            journal.append(("closed", "dead-letter producer"))

    monkeypatch.setattr(inbox_module, "EventDecoder", lambda *a: FakeDecoder())
    monkeypatch.setattr(sources_module, "KafkaSource", Source)  # relay.inbox.sources opens both forms' clients
    monkeypatch.setattr(sources_module, "DeadLetterSender", DeadLetters)
    if form == "sync":
        monkeypatch.setattr(inbox_module, "InboxStore", Store)
        inbox = Inbox(FakeCollection(journal))  # type: ignore[arg-type]
        return inbox, lambda **kw: inbox.run(lambda e, s: None, **kw)
    monkeypatch.setattr(async_module, "AsyncInboxStore", AsyncStore)
    inbox = AsyncInbox(AsyncFakeCollection(journal))  # type: ignore[arg-type]

    async def handler(event, session):
        pass

    return inbox, lambda **kw: asyncio.run(inbox.run(handler, **kw))


RUN = dict(topics=["t"], group_id="g", bootstrap_servers="b:9092")


def test_a_stop_asked_before_run_began_makes_run_return_at_once(monkeypatch, form):
    journal: list = []
    inbox, run = _patched(monkeypatch, journal, form)
    inbox.stop()
    run(**RUN)
    assert ("gathered", "nothing") not in journal
    assert ("closed", "consumer") in journal and ("ended", "session") in journal


def test_a_client_that_fails_to_open_leaves_none_of_the_others_open(monkeypatch, form):
    journal: list = []
    inbox, run = _patched(monkeypatch, journal, form, source_error=RuntimeError("no broker"))
    with pytest.raises(RuntimeError, match="no broker"):
        run(**RUN, on_poison="dead-letter")
    assert journal == [("indexes", "ensured"), ("closed", "dead-letter producer")]


def test_a_cancelled_async_run_closes_the_consumer_on_its_thread_and_reraises_cancelled_error(monkeypatch):
    journal: list = []
    gathering = threading.Event()
    threads: set[str] = set()

    def gather(stop):  # a poll in progress on the Kafka thread when the task is cancelled
        threads.add(threading.current_thread().name)
        gathering.set()
        stop.wait(5)  # until the cancelled run's clean-up asks it to stop
        return []

    inbox, _ = _patched(monkeypatch, journal, "async", gather=gather)

    async def handler(event, session):
        pass

    async def main():
        task = asyncio.create_task(inbox.run(handler, **RUN, on_poison="dead-letter"))
        while not gathering.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task

    task = asyncio.run(main())
    assert task.cancelled()
    assert [e for e in journal if e[0] in ("closed", "ended")] == [
        ("ended", "session"), ("closed", "consumer"), ("closed", "dead-letter producer")]
    assert all(name.startswith("relay-inbox-kafka-g") for name in threads)
    inbox.stop()  # the signal was cleared by the run's end: a new run would start afresh

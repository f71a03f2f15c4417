"""The inbox against real servers: the relay publishes from a real MongoDB to a real Kafka broker,
the inbox applies the events to MongoDB; effects and order are checked against the outbox
(tests/inbox_support.py: every aggregate's effects are exactly its events' sequence numbers, in
commit order). Every scenario runs with both forms, `Inbox` and `AsyncInbox` (`form`), and the
replay and the rebalance also with a sync and an async consumer in one group. Kills and a primary
step-down are in tests/faults/test_inbox_faults.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import pytest
from bson import Decimal128, ObjectId
from confluent_kafka import Consumer, Producer, TopicPartition
from pymongo import AsyncMongoClient

from relay.commands.status import reset_checkpoint
from relay.inbox import AsyncInbox, Inbox, InboxEvent
from relay.inbox.poison import HEADER_SOURCE, InboxPoisonError
from relay.outbox import Outbox, OutboxEvent
from tests.inbox_support import (
    FORMS,
    INBOX,
    AsyncInboxThread,
    InboxThread,
    assert_effects_exactly_once_in_order,
    async_effects_handler,
    consumer,
    effects,
    effects_handler,
    wait_applied,
)
from tests.support.oracle import all_published
from tests.support.relays import RelayThread
from tests.support.topics import read_messages, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes, write_events


def _run(env, group: str = "shipping", **options):
    return dict(topics=[env.topic()], group_id=group, bootstrap_servers=env.servers.kafka_bootstrap, **options)


def _published(env, total: int, **kw) -> Written:
    written = write_events(env.db, env.settings.outbox_collection, total, writers=3, **kw)
    with RelayThread(env.settings):
        all_published(env, written)
    return written


@pytest.mark.parametrize("forms", [("sync",), ("async",), ("sync", "async")], ids="+".join)
def test_relay_replay_after_checkpoint_reset_is_skipped_by_event_id_at_new_offsets(env, forms):
    """One consumer of either form, or a sync and an async one side by side in the group."""
    written = _published(env, 600)
    consumers = [consumer(form, env, **_run(env)) for form in forms]
    for c in consumers:
        c.__enter__()

    def alive():
        for c in consumers:  # every one of them: a consumer that died would leave its share to the other
            c.check_alive()

    try:
        wait_applied(env.db, 600, alive=alive)
        reset_checkpoint(env.settings, force=True)  # the relay publishes everything again
        with RelayThread(env.settings):
            wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1200, 90, "the replay")
        total = lambda name: sum(c.metric(name, topic=env.topic()) for c in consumers)  # noqa: E731
        wait_until(lambda: total("relay_inbox_duplicates_skipped_total") >= 600, 60, "the replayed events skipped",
                   alive=alive)
        processed = total("relay_inbox_events_processed_total")
        # Every partition read to its end and committed; the lag comes from librdkafka's
        # statistics (every 5 s), so it gets there without a further commit.
        lags = lambda: {p: lag for c in consumers for p, lag in c.lags().items()}  # noqa: E731
        wait_until(lambda: lags() == {0: 0, 1: 0, 2: 0}, 30, f"zero lag, got {lags()}", alive=alive)
        alive()
    finally:
        for c in reversed(consumers):
            c.__exit__(None, None, None)
    assert processed == 600
    assert all(c.lags() == {} for c in consumers)  # a stopped inbox reports no lag
    assert_effects_exactly_once_in_order(env.db, written)
    assert env.db[INBOX].count_documents({"group": "shipping"}) == 600


@pytest.mark.parametrize("forms", [("sync", "sync"), ("async", "sync"), ("sync", "async")], ids="-then-".join)
def test_rebalance_between_two_consumers_of_one_group_applies_every_event_once_in_order(env, forms):
    """The second consumer joins while the first works (the partitions are split between them),
    then the first leaves (its partitions move to the second): with an async and a sync consumer,
    a service migrating from one form to the other."""
    written = Written()
    with RelayThread(env.settings):
        # Paced (about 10 s of writes) so the second consumer joins while there is still work.
        writer = background_writes(env, written, 2400, writers=3, pause=0.03)
        with consumer(forms[0], env, **_run(env, batch_max_events=50)) as first:
            wait_applied(env.db, 400, alive=first.check_alive)
            with consumer(forms[1], env, **_run(env, batch_max_events=50)) as second:
                wait_until(lambda: second.metric("relay_inbox_batches_total") > 0, 60, "the second consumer's share")
                # Each reports the lag of the partitions it holds, and no longer of those it lost.
                wait_until(lambda: set(first.lags()) | set(second.lags()) == {0, 1, 2}
                           and not set(first.lags()) & set(second.lags()) and first.lags() and second.lags(), 30,
                           f"the lag series split between the two, got {first.lags()} and {second.lags()}")
                wait_applied(env.db, 1400, alive=second.check_alive)
                first.inbox.stop()  # leaves the group: its partitions move to the second
                writer.join()
                wait_applied(env.db, 2400, alive=second.check_alive)
    assert_effects_exactly_once_in_order(env.db, written)
    assert first.metric("relay_inbox_batches_total") > 0 and second.metric("relay_inbox_batches_total") > 0


def _committed(env, group: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": env.servers.kafka_bootstrap, "group.id": group})
    try:
        return consumer.committed([TopicPartition(env.topic(), partition)], timeout=10)[0].offset
    finally:
        consumer.close()


def _run_until_it_raises(form, env, handler_fail_on, **run):
    """One `run` of `form` in the test's thread (the async one in an event loop), to its error."""
    if form == "sync":
        Inbox(env.db[INBOX]).run(effects_handler(env.db, handler_fail_on), **run)
        return

    async def main():
        client = AsyncMongoClient(env.settings.mongodb_uri, tz_aware=True)
        try:
            db = client[env.settings.database]
            await AsyncInbox(db[INBOX]).run(async_effects_handler(db, handler_fail_on), **run)
        finally:
            await client.close()

    asyncio.run(main())


@pytest.mark.parametrize("form", FORMS)
def test_poison_handler_error_stops_naming_the_event_and_commits_nothing_after_it(env, logs, form):
    written = _published(env, 300)
    poison_id = written.per_aggregate[sorted(written.per_aggregate)[0]][2]
    captured = logs("json")
    for attempt in range(2):  # a restart stops at the same event
        with pytest.raises(InboxPoisonError) as stopped:
            _run_until_it_raises(form, env, lambda e: e.event_id == poison_id, **_run(env))
        assert stopped.value.event_id == poison_id and stopped.value.exit_code == 4
        if attempt == 0:
            first = stopped.value
    assert (stopped.value.partition, stopped.value.offset) == (first.partition, first.offset)
    line = next(line for line in captured.errors() if line["message"].startswith("stopping on InboxPoisonError"))
    assert (line["event_id"], line["topic"], line["partition"], line["offset"]) == (
        poison_id, env.topic(), first.partition, first.offset)
    assert "refusing" in line["reason"] and line["error_kind"] == "InboxPoisonError"
    assert _committed(env, "shipping", first.partition) == first.offset
    # Nothing of the poison event's aggregate after it, everything before it.
    agg = sorted(written.per_aggregate)[0]
    assert effects(env.db)[agg] == [1, 2]


@pytest.mark.parametrize("form", FORMS)
def test_poison_dead_letter_sends_handler_failures_and_undecodable_messages_and_goes_on(env, form):
    with Producer({"bootstrap.servers": env.servers.kafka_bootstrap}) as producer:
        producer.produce(env.topic(), value=b"not avro", key=b"junk", headers=[("ce_id", b"junk-1")])
        assert producer.flush(10) == 0
    written = write_events(env.db, env.settings.outbox_collection, 300, writers=3)
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 301, 60, "every event published")
    poison_id = written.per_aggregate[sorted(written.per_aggregate)[1]][0]
    dlq = f"{env.topic()}.dlq"
    fail_on = lambda e: e.event_id == poison_id  # noqa: E731
    with consumer(form, env, fail_on, **_run(env, on_poison="dead-letter", dead_letter_topic=dlq)) as inbox:
        wait_until(lambda: inbox.metric("relay_inbox_dead_letters_total", topic=env.topic()) >= 2, 60,
                   "two dead letters", alive=inbox.check_alive)
        wait_until(lambda: inbox.metric("relay_inbox_events_processed_total", topic=env.topic()) >= 299, 60,
                   "the rest applied", alive=inbox.check_alive)
    letters = read_messages(env.servers.kafka_bootstrap, dlq)
    reasons = {dict(m.headers())["ce_id"].decode(): dict(m.headers()) for m in letters}
    assert set(reasons) == {poison_id, "junk-1"}
    assert b"refusing" in reasons[poison_id]["relay_dead_letter_reason"]
    assert b"cannot decode" in reasons["junk-1"]["relay_dead_letter_reason"]
    assert reasons["junk-1"][HEADER_SOURCE].startswith(env.topic().encode())
    assert env.db[INBOX].find_one({"eventId": poison_id})["deadLettered"] is True
    assert inbox.metric("relay_inbox_handler_errors_total", topic=env.topic()) == 1
    assert_effects_exactly_once_in_order(env.db, written, except_ids={poison_id})


@pytest.mark.parametrize("form", FORMS)
def test_events_decode_to_the_outbox_fields_in_both_envelopes(env, form):
    outbox = Outbox(env.db[env.settings.outbox_collection])
    at = dt.datetime(1969, 7, 20, 20, 17, 40, 123000, tzinfo=dt.UTC)
    typed = OutboxEvent.new("order", "o-1", "OrderCreated", {"orderId": "o-1", "amount": 12.5, "step": 1},
                            headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "team": "x"})
    oid = ObjectId()
    generic = OutboxEvent.new("order", "o-1", "Noted", {"ref": oid, "price": Decimal128("12.345"), "seq": 7,
                                                       "when": at}, occurred_at=at, trace_context=False)
    outbox.add_many([typed, generic])
    got: list[InboxEvent] = []
    with RelayThread(env.settings):
        run = _run(env, group=uuid.uuid4().hex)
        if form == "sync":
            thread = InboxThread(env.db, lambda e, s: got.append(e), **run)
        else:
            async def collect(event, session):
                got.append(event)
            thread = AsyncInboxThread(env.settings.mongodb_uri, env.settings.database, lambda db: collect, **run)
        with thread as t:
            wait_until(lambda: len(got) >= 2, 60, "two events", alive=t.check_alive)
    a, b = got
    assert (a.event_id, a.aggregate_type, a.aggregate_id, a.event_type) == (typed.id_str, "order", "o-1", "OrderCreated")
    assert a.payload == {"orderId": "o-1", "amount": 12.5, "step": 1}
    assert a.headers == {"traceparent": typed.headers["traceparent"], "team": "x"}
    assert a.occurred_at == typed.occurred_at and a.topic == env.topic()
    assert b.payload == {"ref": oid, "price": Decimal128("12.345"), "seq": 7, "when": at}
    assert b.occurred_at == at and b.headers is None and b.event_type == "Noted"


@pytest.mark.parametrize("form", FORMS)
def test_records_are_unique_per_group_and_expire_after_the_retention_which_can_change(env, form):
    from pymongo.errors import DuplicateKeyError

    from relay.inbox.async_store import AsyncInboxStore
    from relay.inbox.store import InboxStore

    def ensure(retention=dt.timedelta(days=7)):
        if form == "sync":
            InboxStore(env.db[INBOX], "shipping", retention).ensure_indexes()
            return

        async def main():
            client = AsyncMongoClient(env.settings.mongodb_uri)
            try:
                await AsyncInboxStore(client[env.settings.database][INBOX], "shipping", retention).ensure_indexes()
            finally:
                await client.close()
        asyncio.run(main())

    ensure()
    indexes = env.db[INBOX].index_information()
    assert indexes["retention"]["expireAfterSeconds"] == 7 * 24 * 3600 and indexes["retention"]["key"] == [
        ("processedAt", 1)]
    assert indexes["group_event"]["unique"] is True
    ensure(dt.timedelta(days=2))  # changed: collMod
    assert env.db[INBOX].index_information()["retention"]["expireAfterSeconds"] == 2 * 24 * 3600
    env.db[INBOX].insert_one({"group": "shipping", "eventId": "e1"})
    env.db[INBOX].insert_one({"group": "billing", "eventId": "e1"})  # another group may share the collection
    with pytest.raises(DuplicateKeyError):
        env.db[INBOX].insert_one({"group": "shipping", "eventId": "e1"})

"""`AsyncOutbox` against a real MongoDB and Kafka: events written inside the service's asyncio
transactions commit with the business write, an aborted transaction leaves neither, the relay
publishes what committed and nothing else; the documents and the index are the sync `Outbox`'s.
Each writer, and each inbox, refuses the other API's collection when it is built (`TypeError`):
the issue's silent loss (`Outbox(async_collection).add(...)`: an event id returned, the insert a
coroutine never awaited, the order committed without its event) cannot happen."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from relay import AsyncOutbox, Outbox, OutboxEvent
from relay.inbox import AsyncInbox, Inbox
from tests.support.relays import RelayThread
from tests.support.topics import read_topic
from tests.support.waiting import wait_until


class Aborted(Exception):
    """Raised inside a transaction to abort it."""


def _order(order_id: str, amount: float) -> OutboxEvent:
    return OutboxEvent.new("order", order_id, "OrderCreated", {"orderId": order_id, "amount": amount, "step": 1})


async def _orders(env: Any, committed: int, aborted: int) -> dict[str, list[str]]:
    """Orders and their events in asyncio transactions, every other one aborted after both writes;
    the event ids of the committed and of the aborted transactions."""
    client: AsyncMongoClient[Any] = AsyncMongoClient(env.settings.mongodb_uri, tz_aware=True)
    db = client[env.settings.database]
    outbox = AsyncOutbox(db[env.settings.outbox_collection])
    ids: dict[str, list[str]] = {"committed": [], "aborted": []}
    try:
        async with client.start_session() as session:
            for n in range(committed + aborted):
                abort = n % 2 == 1 and len(ids["aborted"]) < aborted
                event = _order(f"o-{n}", 10.0 + n)
                try:
                    async with await session.start_transaction():
                        await db.orders.insert_one({"_id": f"o-{n}", "amount": 10.0 + n}, session=session)
                        await outbox.add(event, session=session)
                        if abort:
                            raise Aborted
                except Aborted:
                    pass
                ids["aborted" if abort else "committed"].append(event.id_str)
            # add_many: several events of one transaction, in their order
            extra = [OutboxEvent.new("order", "o-many", "Noted", {"seq": i}) for i in range(3)]
            async with await session.start_transaction():
                await outbox.add_many(extra, session=session)
            ids["committed"] += [e.id_str for e in extra]
    finally:
        await client.close()
    return ids


def test_events_commit_with_the_business_write_an_aborted_transaction_leaves_none_and_the_relay_publishes_them(env):
    ids = asyncio.run(_orders(env, committed=6, aborted=4))
    stored = {str(d["_id"]) for d in env.outbox.find()}
    assert stored == set(ids["committed"])  # every committed event, no aborted one
    assert {d["_id"] for d in env.db.orders.find()} == {f"o-{n}" for n in range(10) if n % 2 == 0 or n > 7}
    with RelayThread(env.settings):
        records = wait_until(lambda: (r := read_topic(env.servers.kafka_bootstrap, env.topic()))
                             and len(r) >= len(ids["committed"]) and r, 90, "every committed event published")
    assert sorted(r.id for r in records) == sorted(ids["committed"])
    assert [json.loads(r.event["payload"])["seq"] for r in records if r.key == "o-many"] == [0, 1, 2]


def test_the_async_writer_writes_the_sync_writers_documents_and_index(env):
    event = _order("o-1", 12.5)
    Outbox(env.db.sync_outbox).add(event)

    async def write() -> list[str]:
        client: AsyncMongoClient[Any] = AsyncMongoClient(env.settings.mongodb_uri, tz_aware=True)
        try:
            outbox = AsyncOutbox(client[env.settings.database].async_outbox)
            done = await outbox.init(ttl_seconds=3600)
            await outbox.add(event)
            return done
        finally:
            await client.close()

    done = asyncio.run(write())
    sync_done = Outbox(env.db.sync_outbox).init(ttl_seconds=3600)
    assert env.db.async_outbox.find_one() == env.db.sync_outbox.find_one()
    assert env.db.async_outbox.index_information() == env.db.sync_outbox.index_information()
    assert done[0].startswith("created collection") and done[1:] == sync_done[1:]


def test_each_writer_and_inbox_refuses_the_other_apis_collection_when_built(env):
    async_client: AsyncMongoClient[Any] = AsyncMongoClient(env.settings.mongodb_uri)
    try:
        async_outbox, sync_outbox = async_client.app.outbox, env.outbox
        with pytest.raises(TypeError, match="Outbox takes a pymongo Collection .* use AsyncOutbox"):
            Outbox(async_outbox)
        with pytest.raises(TypeError, match="AsyncOutbox takes a pymongo AsyncCollection .* use Outbox"):
            AsyncOutbox(sync_outbox)
        with pytest.raises(TypeError, match="use relay.inbox.AsyncInbox"):
            Inbox(async_client.app.inbox)
        with pytest.raises(TypeError, match="AsyncInbox takes a pymongo AsyncCollection"):
            AsyncInbox(env.db.inbox)
    finally:
        asyncio.run(async_client.close())
    # Motor's collections return futures from plain methods: the sync writer refuses them too.
    motor_like = type("AsyncIOMotorCollection", (), {"__module__": "motor.motor_asyncio",
                                                      "insert_one": lambda self, doc, session=None: None})()
    with pytest.raises(TypeError, match="AsyncIOMotorCollection"):
        Outbox(motor_like)
    assert env.outbox.count_documents({}) == 0


def test_each_inbox_refuses_a_handler_of_the_other_form_before_consuming(env):
    async def async_handler(event, session):
        pass

    run = dict(topics=[env.topic()], group_id="g", bootstrap_servers=env.servers.kafka_bootstrap)
    with pytest.raises(TypeError, match="async def handler needs relay.inbox.AsyncInbox"):
        Inbox(env.db.inbox).run(async_handler, **run)

    async def main() -> None:
        client: AsyncMongoClient[Any] = AsyncMongoClient(env.settings.mongodb_uri)
        try:
            await AsyncInbox(client[env.settings.database].inbox).run(lambda e, s: None, **run)
        finally:
            await client.close()

    with pytest.raises(TypeError, match="pass an async def function"):
        asyncio.run(main())
    assert "inbox" not in env.db.list_collection_names()  # refused before any index was created

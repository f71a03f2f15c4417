"""The writers services use: add outbox events inside the service's own transaction.

A service writes its business document and an outbox event in one transaction, with PyMongo's
synchronous API:

    with client.start_session() as session, session.start_transaction():
        orders.insert_one(order, session=session)
        Outbox(db.outbox).add(OutboxEvent.new("order", order_id, "OrderCreated", payload),
                              session=session)

or with its asyncio API (`AsyncMongoClient`, pymongo >= 4.13):

    async with client.start_session() as session, await session.start_transaction():
        await orders.insert_one(order, session=session)
        await AsyncOutbox(db.outbox).add(OutboxEvent.new(...), session=session)

Both write the same documents (`OutboxEvent.to_document`) and create the same collection and
index (`init`). Each refuses, when it is built, a collection of the other API (`TypeError`): an
`Outbox` over an `AsyncCollection` would return an event id for an insert that never runs (a
coroutine never awaited), the very loss the outbox exists to prevent.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import CollectionInvalid

from relay.outbox.event import DEFAULT_FIELDS, FieldNames, OutboxEvent

OCCURRED_AT_INDEX = "occurredAt_1"


def is_async_collection(collection: object) -> bool:
    """Whether `collection` is written with `await`: PyMongo's AsyncCollection, any collection
    whose `insert_one` is a coroutine function, or a Motor collection (whose methods return
    futures: a sync writer would drop them as surely as a coroutine)."""
    return inspect.iscoroutinefunction(getattr(collection, "insert_one", None)) or type(
        collection
    ).__module__.startswith("motor.")


def require_sync_collection(collection: object, user: str, instead: str) -> None:
    """Raise TypeError when `user` (a class name) is given an asyncio collection; `instead` names
    the class that takes one."""
    if is_async_collection(collection):
        raise TypeError(
            f"{user} takes a pymongo Collection (the synchronous API); got {type(collection).__name__}, "
            f"whose writes must be awaited: use {instead} with an AsyncCollection"
        )


def require_async_collection(collection: object, user: str, instead: str) -> None:
    """Raise TypeError when `user` is given a collection that is not an asyncio one."""
    if not is_async_collection(collection):
        raise TypeError(
            f"{user} takes a pymongo AsyncCollection (AsyncMongoClient, the asyncio API); got "
            f"{type(collection).__name__}: use {instead} with a synchronous Collection"
        )


class _Documents:
    """What both writers write: the event documents, the collection, the occurrence-time index."""

    def __init__(self, collection: Any, fields: FieldNames) -> None:
        self.collection = collection
        self.fields = fields

    def _documents(self, events: Iterable[OutboxEvent]) -> list[dict[str, Any]]:
        return [e.to_document(self.fields) for e in events]

    def _index(self, ttl_seconds: int | None) -> tuple[list[tuple[str, int]], dict[str, Any], str]:
        """(keys, options, what `init` reports) of the index on the occurrence time."""
        options: dict[str, Any] = {"name": OCCURRED_AT_INDEX}
        if ttl_seconds is not None:
            options["expireAfterSeconds"] = ttl_seconds
        shown = f"index {OCCURRED_AT_INDEX} on {self.fields.occurred_at}"
        return (
            [(self.fields.occurred_at, ASCENDING)],
            options,
            shown + (f" (TTL {ttl_seconds}s)" if ttl_seconds is not None else ""),
        )


class Outbox(_Documents):
    """The writer services use with PyMongo's synchronous API: add events inside the service's
    own transaction. Raises TypeError when built over an AsyncCollection (use AsyncOutbox)."""

    def __init__(self, collection: Collection[Any], fields: FieldNames = DEFAULT_FIELDS) -> None:
        require_sync_collection(collection, "Outbox", "AsyncOutbox")
        super().__init__(collection, fields)

    def add(self, event: OutboxEvent, session: ClientSession | None = None) -> ObjectId | str:
        """Insert one event; pass the session of the transaction that writes the business data."""
        self.collection.insert_one(event.to_document(self.fields), session=session)
        return event.event_id

    def add_many(self, events: Iterable[OutboxEvent], session: ClientSession | None = None) -> list[Any]:
        """Insert the events in their order (one ordered insert); their ids."""
        docs = self._documents(events)
        self.collection.insert_many(docs, ordered=True, session=session)
        return [d["_id"] for d in docs]

    def init(self, ttl_seconds: int | None = None) -> list[str]:
        """Create the collection (transactions cannot create it implicitly on every version) and
        an index on the occurrence time; with `ttl_seconds`, old events expire (only do that
        when the relay is sure to have published them by then). Returns what it did."""
        done = []
        try:
            self.collection.database.create_collection(self.collection.name)
            done.append(f"created collection {self.collection.full_name}")
        except CollectionInvalid:
            done.append(f"collection {self.collection.full_name} exists")
        keys, options, shown = self._index(ttl_seconds)
        self.collection.create_index(keys, **options)
        return [*done, shown]


class AsyncOutbox(_Documents):
    """`Outbox` for asyncio services (PyMongo's AsyncCollection): the same documents, the same
    index, every write awaited. Raises TypeError when built over a synchronous Collection."""

    def __init__(self, collection: AsyncCollection[Any], fields: FieldNames = DEFAULT_FIELDS) -> None:
        require_async_collection(collection, "AsyncOutbox", "Outbox")
        super().__init__(collection, fields)

    async def add(self, event: OutboxEvent, session: AsyncClientSession | None = None) -> ObjectId | str:
        """Insert one event; pass the session of the transaction that writes the business data.
        Returns once the insert is done (inside a transaction: part of it, committed with it)."""
        await self.collection.insert_one(event.to_document(self.fields), session=session)
        return event.event_id

    async def add_many(self, events: Iterable[OutboxEvent], session: AsyncClientSession | None = None) -> list[Any]:
        """Insert the events in their order (one ordered insert); their ids."""
        docs = self._documents(events)
        await self.collection.insert_many(docs, ordered=True, session=session)
        return [d["_id"] for d in docs]

    async def init(self, ttl_seconds: int | None = None) -> list[str]:
        """As `Outbox.init`: the collection and the index on the occurrence time (`ttl_seconds`:
        old events expire). Returns what it did."""
        done = []
        try:
            await self.collection.database.create_collection(self.collection.name)
            done.append(f"created collection {self.collection.full_name}")
        except CollectionInvalid:
            done.append(f"collection {self.collection.full_name} exists")
        keys, options, shown = self._index(ttl_seconds)
        await self.collection.create_index(keys, **options)
        return [*done, shown]

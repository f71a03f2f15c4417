"""The MongoDB step of the async inbox: `InboxStore` over PyMongo's asyncio API, every call awaited.

The same records (relay.inbox.records), the same transaction and the same order as the sync
store (relay.inbox.store): one query for the batch's recorded ids, `batching.plan`, the handler
for each event to run, in order, one `insert_many`, the commit, all inside pymongo's
`AsyncClientSession.with_transaction` (retried on TransientTransactionError and
UnknownTransactionCommitResult for up to 120 s). A task cancelled inside the transaction aborts it
(with_transaction aborts on any exception, CancelledError included, then re-raises it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import OperationFailure

from relay.inbox.batching import plan
from relay.inbox.errors import HandlerError, retryable
from relay.inbox.event import InboxEvent
from relay.inbox.records import (
    DEFAULT_RETENTION,
    INDEX_OPTIONS_CONFLICT,
    MAJORITY,
    SNAPSHOT,
    Applied,
    Records,
)

AsyncHandler = Callable[[InboxEvent, AsyncClientSession], Awaitable[object]]


class AsyncInboxStore:
    """The inbox collection of one consumer group (PyMongo's AsyncCollection)."""

    def __init__(
        self, collection: AsyncCollection[Any], group_id: str, retention: dt.timedelta | float = DEFAULT_RETENTION
    ) -> None:
        self.records = Records(group_id, retention)
        self.collection = collection.with_options(write_concern=MAJORITY)
        self.group_id = group_id

    async def ensure_indexes(self) -> None:
        """As InboxStore.ensure_indexes: the unique, the selection and the TTL indexes (the TTL one
        changed by collMod)."""
        for keys, options in [self.records.unique_index(), *self.records.selection_indexes()]:
            await self.collection.create_index(keys, **options)
        field, options = self.records.ttl_index()
        try:
            await self.collection.create_index(field, **options)
        except OperationFailure as exc:
            if exc.code != INDEX_OPTIONS_CONFLICT:
                raise
            await self.collection.database.command("collMod", self.collection.name, index=self.records.ttl_change())

    async def recorded(self, event_ids: Sequence[str], session: AsyncClientSession | None = None) -> set[str]:
        """The ids among `event_ids` this group has recorded."""
        found = self.collection.find(self.records.query(event_ids), {"eventId": 1, "_id": 0}, session=session)
        return {doc["eventId"] async for doc in found}

    async def apply(self, session: AsyncClientSession, events: Sequence[InboxEvent], handler: AsyncHandler) -> Applied:
        """As InboxStore.apply, the handler awaited: returns once the transaction committed;
        raises HandlerError when the handler raised for an event (nothing of the batch committed)."""
        attempts = 0
        result: list[Applied] = []

        async def callback(s: AsyncClientSession) -> None:
            nonlocal attempts
            attempts += 1
            result.clear()
            todo = plan(events, await self.recorded([e.event_id for e in events], s))
            for event in todo.run:
                await call_async_handler(handler, event, s)
            if todo.run:
                await self.collection.insert_many(self.records.of(todo.run), session=s)
            result.append(Applied(todo.run, todo.skip, attempts))

        await session.with_transaction(callback, read_concern=SNAPSHOT, write_concern=MAJORITY)
        return result[-1]

    async def record_dead_letter(
        self, session: AsyncClientSession, event_id: str, where: tuple[str, int, int], event: InboxEvent | None = None
    ) -> None:
        """Record a dead-lettered event (in its own transaction), so a replay of it is skipped;
        with its fields when it was decoded (`event`)."""

        async def callback(s: AsyncClientSession) -> None:
            if not await self.recorded([event_id], s):
                await self.collection.insert_one(self.records.dead_letter(event_id, where, event), session=s)

        await session.with_transaction(callback, write_concern=MAJORITY)


async def call_async_handler(handler: AsyncHandler, event: InboxEvent, session: AsyncClientSession) -> None:
    """The handler for one event, awaited; what it raises is classified as in the sync inbox
    (relay.inbox.store.call_handler: retryable errors propagate, others are HandlerError). CancelledError is not an Exception: it propagates."""
    try:
        await handler(event, session)
    except Exception as exc:
        if retryable(exc):
            raise
        raise HandlerError(event, exc) from exc

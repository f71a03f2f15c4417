"""The MongoDB step of the sync inbox: the inbox records and the handler's writes in one
transaction per batch (the records: relay.inbox.records; the async form: relay.inbox.async_store).

`InboxStore.apply` is one transaction for a whole batch: one query for the batch's recorded ids,
the handler for each event not recorded (in order), one `insert_many` of the new records, the
commit. pymongo's `ClientSession.with_transaction` retries the whole callback on
TransientTransactionError (write conflict, primary change) and the commit on
UnknownTransactionCommitResult, for up to 120 s; a retry runs the same events in the same order
(nothing is reordered), and re-reads the recorded ids, so an event recorded meanwhile is skipped.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from pymongo.client_session import ClientSession
from pymongo.collection import Collection
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

Handler = Callable[[InboxEvent, ClientSession], object]


class InboxStore:
    """The inbox collection of one consumer group (PyMongo's synchronous API)."""

    def __init__(
        self, collection: Collection[Any], group_id: str, retention: dt.timedelta | float = DEFAULT_RETENTION
    ) -> None:
        self.records = Records(group_id, retention)
        self.collection = collection.with_options(write_concern=MAJORITY)
        self.group_id = group_id
        self.retention = self.records.retention

    def ensure_indexes(self) -> None:
        """The unique index on (group, eventId), the indexes `inbox forget` selects by
        (relay.inbox.records), and the TTL index on `processedAt`; a TTL index created earlier with
        another retention is changed to this one (collMod). On a collection of records written
        before the selection indexes existed, the first start builds them (and waits for that)."""
        for keys, options in [self.records.unique_index(), *self.records.selection_indexes()]:
            self.collection.create_index(keys, **options)
        field, options = self.records.ttl_index()
        try:
            self.collection.create_index(field, **options)
        except OperationFailure as exc:
            if exc.code != INDEX_OPTIONS_CONFLICT:
                raise
            self.collection.database.command("collMod", self.collection.name, index=self.records.ttl_change())

    def recorded(self, event_ids: Sequence[str], session: ClientSession | None = None) -> set[str]:
        """The ids among `event_ids` this group has recorded."""
        found = self.collection.find(self.records.query(event_ids), {"eventId": 1, "_id": 0}, session=session)
        return {doc["eventId"] for doc in found}

    def apply(self, session: ClientSession, events: Sequence[InboxEvent], handler: Handler) -> Applied:
        """Run `handler` for the events not yet recorded and record them, in one transaction.

        Returns once the transaction committed. Raises HandlerError when the handler raised for an
        event (nothing of the batch is committed); errors of the database that outlast pymongo's
        retries, and retryable errors the handler raised, propagate (relay.inbox.errors).
        """
        attempts = 0
        result: list[Applied] = []

        def callback(s: ClientSession) -> None:
            nonlocal attempts
            attempts += 1
            result.clear()
            todo = plan(events, self.recorded([e.event_id for e in events], s))
            for event in todo.run:
                call_handler(handler, event, s)
            if todo.run:
                self.collection.insert_many(self.records.of(todo.run), session=s)
            result.append(Applied(todo.run, todo.skip, attempts))

        session.with_transaction(callback, read_concern=SNAPSHOT, write_concern=MAJORITY)
        return result[-1]

    def record_dead_letter(
        self, session: ClientSession, event_id: str, where: tuple[str, int, int], event: InboxEvent | None = None
    ) -> None:
        """Record a dead-lettered event (in its own transaction), so a replay of it is skipped;
        with its fields when it was decoded (`event`)."""

        def callback(s: ClientSession) -> None:
            if not self.recorded([event_id], s):
                self.collection.insert_one(self.records.dead_letter(event_id, where, event), session=s)

        session.with_transaction(callback, write_concern=MAJORITY)


def call_handler(handler: Handler, event: InboxEvent, session: ClientSession) -> None:
    """The handler for one event. What it raises becomes HandlerError (its event is poison),
    except what `relay.inbox.errors.retryable` retries: that propagates as it is, so the
    transaction is aborted and the whole batch runs again. A handler that returns an awaitable
    (an `async def` behind a plain callable) never ran its writes: that is a TypeError, poison
    too, never an event silently taken as handled."""
    try:
        result = handler(event, session)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError("the handler returned an awaitable: Inbox calls plain functions; use AsyncInbox")
    except Exception as exc:
        if retryable(exc):
            raise
        raise HandlerError(event, exc) from exc

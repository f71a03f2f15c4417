"""The MongoDB step: the inbox records and the handler's writes in one transaction per batch.

An inbox record is `{group, eventId, processedAt, topic, partition, offset}` (plus `deadLettered`
for a poison event sent to the dead-letter topic), unique on (group, eventId): two consumer groups
can share one collection, and two transactions recording the same event conflict, so one of them
retries and then sees the event recorded. `processedAt` carries the TTL index (the retention).

`InboxStore.apply` is one transaction for a whole batch: one query for the batch's recorded ids,
the handler for each event not recorded (in order), one `insert_many` of the new records, the
commit. pymongo's `ClientSession.with_transaction` retries the whole callback on
TransientTransactionError (write conflict, primary change) and the commit on
UnknownTransactionCommitResult, for up to 120 s; a retry runs the same events in the same order
(nothing is reordered), and re-reads the recorded ids, so an event recorded meanwhile is skipped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo import ASCENDING
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from relay.inbox.batching import plan
from relay.inbox.errors import retryable
from relay.inbox.event import InboxEvent

Handler = Callable[[InboxEvent, ClientSession], object]

DEFAULT_RETENTION = dt.timedelta(days=7)
TTL_FIELD = "processedAt"
_INDEX_OPTIONS_CONFLICT = 85


class HandlerError(Exception):
    """Raised when the handler raised for `event` (the batch's transaction was aborted)."""

    def __init__(self, event: InboxEvent, cause: BaseException) -> None:
        super().__init__(f"handler raised {type(cause).__name__}: {cause}")
        self.event = event
        self.cause = cause


@dataclass(frozen=True)
class Applied:
    """What one committed transaction did: the events it ran and the ones it skipped."""

    ran: list[InboxEvent]
    skipped: list[InboxEvent]
    attempts: int


class InboxStore:
    """The inbox collection of one consumer group."""

    def __init__(
        self, collection: Collection[Any], group_id: str, retention: dt.timedelta | float = DEFAULT_RETENTION
    ) -> None:
        if not isinstance(retention, dt.timedelta):
            retention = dt.timedelta(seconds=retention)  # a number of seconds
        if retention.total_seconds() < 1:
            raise ValueError(f"retention must be at least 1 s, got {retention}")
        self.collection = collection.with_options(write_concern=WriteConcern("majority"))
        self.group_id = group_id
        self.retention = retention

    def ensure_indexes(self) -> None:
        """The unique index on (group, eventId) and the TTL index on `processedAt`; a TTL index
        created earlier with another retention is changed to this one (collMod)."""
        self.collection.create_index([("group", ASCENDING), ("eventId", ASCENDING)], unique=True, name="group_event")
        seconds = int(self.retention.total_seconds())
        try:
            self.collection.create_index(TTL_FIELD, expireAfterSeconds=seconds, name="retention")
        except OperationFailure as exc:
            if exc.code != _INDEX_OPTIONS_CONFLICT:
                raise
            self.collection.database.command(
                "collMod", self.collection.name, index={"name": "retention", "expireAfterSeconds": seconds}
            )

    def recorded(self, event_ids: Sequence[str], session: ClientSession | None = None) -> set[str]:
        """The ids among `event_ids` this group has recorded."""
        found = self.collection.find(
            {"group": self.group_id, "eventId": {"$in": list(event_ids)}}, {"eventId": 1, "_id": 0}, session=session
        )
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
                self.collection.insert_many([self._record(e) for e in todo.run], session=s)
            result.append(Applied(todo.run, todo.skip, attempts))

        session.with_transaction(callback, read_concern=ReadConcern("snapshot"), write_concern=WriteConcern("majority"))
        return result[-1]

    def record_dead_letter(self, session: ClientSession, event_id: str, where: tuple[str, int, int]) -> None:
        """Record a dead-lettered event (in its own transaction), so a replay of it is skipped."""

        def callback(s: ClientSession) -> None:
            if not self.recorded([event_id], s):
                self.collection.insert_one(self._record_of(event_id, *where) | {"deadLettered": True}, session=s)

        session.with_transaction(callback, write_concern=WriteConcern("majority"))

    def _record(self, event: InboxEvent) -> dict[str, Any]:
        return self._record_of(event.event_id, event.topic, event.partition, event.offset)

    def _record_of(self, event_id: str, topic: str, partition: int, offset: int) -> dict[str, Any]:
        return {
            "group": self.group_id,
            "eventId": event_id,
            TTL_FIELD: dt.datetime.now(dt.UTC),
            "topic": topic,
            "partition": partition,
            "offset": offset,
        }


def call_handler(handler: Handler, event: InboxEvent, session: ClientSession) -> None:
    """The handler for one event. What it raises becomes HandlerError (its event is poison),
    except what `relay.inbox.errors.retryable` retries: that propagates as it is, so the
    transaction is aborted and the whole batch runs again."""
    try:
        handler(event, session)
    except Exception as exc:
        if retryable(exc):
            raise
        raise HandlerError(event, exc) from exc

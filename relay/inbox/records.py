"""The inbox records, as both stores write them (relay.inbox.store, relay.inbox.async_store).

An inbox record is `{group, eventId, processedAt, topic, partition, offset, aggregateType,
aggregateId, eventType, occurredAt}` (plus `deadLettered` for a poison event sent to the
dead-letter topic), unique on (group, eventId): two consumer groups can share one collection, and
two transactions recording the same event conflict, so one of them retries and then sees the event
recorded. `processedAt` carries the TTL index (the retention). A sync and an async inbox of one
group write the same records, so they can run side by side.

The event's own fields (aggregate type and id, event type, occurredAt: `EVENT_FIELDS`, read from the
message, the same whichever broker delivered it) let an operator select the records of what a
consumer lost (`outbox-relay inbox forget`: relay.inbox.forget) by the replay's filters; two
indexes serve that selection (`selection_indexes`). Records written before they existed (0.2 and
earlier), and the dead-letter record of a message that could not be decoded, lack them: they are
looked up by event id as every record is, and no filter selects them.

`Records` holds what both stores share and neither does I/O with: the indexes, the query for a
batch's recorded ids, the documents, what a committed transaction did (`Applied`). The order of
one transaction (look up the recorded ids, `batching.plan`, the handler for each event to run,
one insert of their records, the commit) is the same in both stores.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pymongo import ASCENDING
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from relay.inbox.event import InboxEvent

DEFAULT_RETENTION = dt.timedelta(days=7)
TTL_FIELD = "processedAt"
UNIQUE_INDEX = "group_event"
TTL_INDEX = "retention"
# The event's fields a record keeps (InboxEvent attribute -> record field), and the indexes that
# select records by them: one aggregate's records in a time range; a time range (of some types).
EVENT_FIELDS = {
    "aggregate_type": "aggregateType",
    "aggregate_id": "aggregateId",
    "event_type": "eventType",
    "occurred_at": "occurredAt",
}
AGGREGATE_INDEX = "group_aggregate_occurred"
OCCURRED_INDEX = "group_occurred_type"
INDEX_OPTIONS_CONFLICT = 85  # createIndex: an index of that name exists with other options
# The batch's transaction reads a snapshot (the recorded ids it looked up hold until it commits)
# and commits with majority write concern, as every inbox write.
SNAPSHOT = ReadConcern("snapshot")
MAJORITY = WriteConcern("majority")


@dataclass(frozen=True)
class Applied:
    """What one committed transaction did: the events it ran and the ones it skipped."""

    ran: list[InboxEvent]
    skipped: list[InboxEvent]
    attempts: int


def retention_of(retention: dt.timedelta | float) -> dt.timedelta:
    """The retention as a timedelta (a number is seconds); at least 1 s, else ValueError."""
    if not isinstance(retention, dt.timedelta):
        retention = dt.timedelta(seconds=retention)
    if retention.total_seconds() < 1:
        raise ValueError(f"retention must be at least 1 s, got {retention}")
    return retention


class Records:
    """The records of one consumer group: what both stores write and ask for."""

    def __init__(self, group_id: str, retention: dt.timedelta | float = DEFAULT_RETENTION) -> None:
        self.group_id = group_id
        self.retention = retention_of(retention)

    @property
    def ttl_seconds(self) -> int:
        return int(self.retention.total_seconds())

    def unique_index(self) -> tuple[list[tuple[str, int]], dict[str, Any]]:
        return [("group", ASCENDING), ("eventId", ASCENDING)], {"unique": True, "name": UNIQUE_INDEX}

    def selection_indexes(self) -> list[tuple[list[tuple[str, int]], dict[str, Any]]]:
        """The indexes `inbox forget`'s selections use: (group, aggregateId, occurredAt) for
        `--aggregate`, (group, occurredAt, aggregateType) for a time range and `--aggregate-type`."""
        return [
            ([("group", ASCENDING), ("aggregateId", ASCENDING), ("occurredAt", ASCENDING)], {"name": AGGREGATE_INDEX}),
            ([("group", ASCENDING), ("occurredAt", ASCENDING), ("aggregateType", ASCENDING)], {"name": OCCURRED_INDEX}),
        ]

    def ttl_index(self) -> tuple[str, dict[str, Any]]:
        return TTL_FIELD, {"expireAfterSeconds": self.ttl_seconds, "name": TTL_INDEX}

    def ttl_change(self) -> dict[str, Any]:
        """The collMod index option that changes the TTL index to this retention."""
        return {"name": TTL_INDEX, "expireAfterSeconds": self.ttl_seconds}

    def query(self, event_ids: Sequence[str]) -> dict[str, Any]:
        """The filter for the records among `event_ids` of this group."""
        return {"group": self.group_id, "eventId": {"$in": list(event_ids)}}

    def of(self, events: Sequence[InboxEvent]) -> list[dict[str, Any]]:
        """The records of `events` (their handlers ran in this transaction)."""
        return [self.record(e.event_id, (e.topic, e.partition, e.offset), e) for e in events]

    def record(self, event_id: str, where: tuple[str, int, int], event: InboxEvent | None = None) -> dict[str, Any]:
        """The record of `event_id`, delivered at `where` (topic, partition, offset); with the
        event's own fields when it was decoded (`event`)."""
        topic, partition, offset = where
        record: dict[str, Any] = {
            "group": self.group_id,
            "eventId": event_id,
            TTL_FIELD: dt.datetime.now(dt.UTC),
            "topic": topic,
            "partition": partition,
            "offset": offset,
        }
        if event is not None:
            record.update({field: getattr(event, attribute) for attribute, field in EVENT_FIELDS.items()})
        return record

    def dead_letter(
        self, event_id: str, where: tuple[str, int, int], event: InboxEvent | None = None
    ) -> dict[str, Any]:
        """The record of a dead-lettered event: a replay of it is skipped (until `inbox forget`
        selects it by the event's fields, known when its handler raised, not when it was undecodable)."""
        return self.record(event_id, where, event) | {"deadLettered": True}

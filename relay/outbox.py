"""The outbox contract: the event document, its parser, and the writer services use.

A service writes its business document and an outbox event in one transaction:

    with client.start_session() as session, session.start_transaction():
        orders.insert_one(order, session=session)
        Outbox(db.outbox).add(OutboxEvent.new("order", order_id, "OrderCreated", payload),
                              session=session)

Field names are configurable (`FieldNames`), for outboxes written for other relays.
`parse()` is the one place that checks a document; a problem raises `MalformedEventError`
naming the field, which the relay turns into a poison event naming the event id.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import CollectionInvalid

from relay.config import Settings


class MalformedEventError(ValueError):
    """Raised when an outbox document lacks a field or holds the wrong type in it."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"field {field_name!r} {problem}")
        self.field_name = field_name


@dataclass(frozen=True)
class FieldNames:
    """Where each part of an event lives in the outbox document."""

    aggregate_type: str = "aggregateType"
    aggregate_id: str = "aggregateId"
    event_type: str = "eventType"
    payload: str = "payload"
    occurred_at: str = "occurredAt"
    headers: str = "headers"
    topic: str = "topic"

    @classmethod
    def from_settings(cls, s: Settings) -> FieldNames:
        return cls(s.field_aggregate_type, s.field_aggregate_id, s.field_event_type,
                   s.field_payload, s.field_occurred_at, s.field_headers, s.field_topic)


DEFAULT_FIELDS = FieldNames()


def _utcnow() -> dt.datetime:
    # BSON dates hold milliseconds: truncate so a round trip compares equal.
    now = dt.datetime.now(dt.timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


@dataclass(frozen=True)
class OutboxEvent:
    """One event, as a service writes it and as the relay reads it back."""

    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: Mapping[str, Any]
    event_id: ObjectId | str = field(default_factory=ObjectId)
    occurred_at: dt.datetime = field(default_factory=_utcnow)
    headers: Mapping[str, str] | None = None
    topic: str | None = None

    @classmethod
    def new(cls, aggregate_type: str, aggregate_id: str, event_type: str,
            payload: Mapping[str, Any], **kw: Any) -> OutboxEvent:
        return cls(aggregate_type, aggregate_id, event_type, payload, **kw)

    @property
    def id_str(self) -> str:
        return str(self.event_id)

    def to_document(self, fields: FieldNames = DEFAULT_FIELDS) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "_id": self.event_id,
            fields.aggregate_type: self.aggregate_type,
            fields.aggregate_id: self.aggregate_id,
            fields.event_type: self.event_type,
            fields.payload: dict(self.payload),
            fields.occurred_at: self.occurred_at,
        }
        if self.headers:
            doc[fields.headers] = dict(self.headers)
        if self.topic:
            doc[fields.topic] = self.topic
        return doc


_ID_TYPES = (ObjectId, str)


def _required_str(doc: Mapping[str, Any], name: str) -> str:
    value = doc.get(name)
    if value.__class__ is str and value:  # the common case, checked first and cheaply
        return value  # type: ignore[no-any-return]
    if value is None:
        raise MalformedEventError(name, _absent(doc, name))
    if not isinstance(value, str) or not value:
        raise MalformedEventError(name, f"must be a non-empty string, got {type(value).__name__}")
    return value


def _absent(doc: Mapping[str, Any], name: str) -> str:
    """How a field without a value is described: "is null" when present as null, else "is missing"."""
    return "is null" if name in doc else "is missing"


def event_id_of(doc: Mapping[str, Any]) -> str:
    """The event id as text, for messages and logs, even for a malformed document."""
    return str(doc.get("_id", "<no _id>"))


def parse(doc: Mapping[str, Any], fields: FieldNames = DEFAULT_FIELDS) -> OutboxEvent:
    """Check an outbox document and return the event; raises MalformedEventError."""
    event_id = doc.get("_id")
    if not isinstance(event_id, _ID_TYPES) or event_id == "":
        raise MalformedEventError("_id", "must be an ObjectId or a non-empty string")
    payload = doc.get(fields.payload)
    if payload is None:
        raise MalformedEventError(fields.payload, _absent(doc, fields.payload))
    if not isinstance(payload, Mapping):
        raise MalformedEventError(fields.payload, f"must be a document, got {type(payload).__name__}")
    occurred_at = doc.get(fields.occurred_at)
    if not isinstance(occurred_at, dt.datetime):
        raise MalformedEventError(fields.occurred_at,
                                  _absent(doc, fields.occurred_at) if occurred_at is None else "must be a date")
    headers = doc.get(fields.headers)
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise MalformedEventError(fields.headers, "must be a document of strings")
        for key, value in headers.items():
            if not isinstance(value, str):
                raise MalformedEventError(f"{fields.headers}.{key}", "must be a string")
    topic = doc.get(fields.topic)
    if topic is not None and (not isinstance(topic, str) or not topic):
        raise MalformedEventError(fields.topic, "must be a non-empty string")
    return OutboxEvent(
        aggregate_type=_required_str(doc, fields.aggregate_type),
        aggregate_id=_required_str(doc, fields.aggregate_id),
        event_type=_required_str(doc, fields.event_type),
        payload=payload,
        event_id=event_id,
        occurred_at=occurred_at,
        headers=headers,
        topic=topic,
    )


class Outbox:
    """The writer services use: add events inside the service's own transaction."""

    def __init__(self, collection: Collection[Any], fields: FieldNames = DEFAULT_FIELDS) -> None:
        self.collection = collection
        self.fields = fields

    def add(self, event: OutboxEvent, session: ClientSession | None = None) -> ObjectId | str:
        """Insert one event; pass the session of the transaction that writes the business data."""
        self.collection.insert_one(event.to_document(self.fields), session=session)
        return event.event_id

    def add_many(self, events: Iterable[OutboxEvent], session: ClientSession | None = None) -> list[Any]:
        docs = [e.to_document(self.fields) for e in events]
        self.collection.insert_many(docs, ordered=True, session=session)
        return [d["_id"] for d in docs]

    def init(self, ttl_seconds: int | None = None) -> list[str]:
        """Create the collection (transactions cannot create it implicitly on every version) and
        an index on the occurrence time; with `ttl_seconds`, old events expire (only do that
        when the relay is sure to have published them by then)."""
        done = []
        try:
            self.collection.database.create_collection(self.collection.name)
            done.append(f"created collection {self.collection.full_name}")
        except CollectionInvalid:
            done.append(f"collection {self.collection.full_name} exists")
        options: dict[str, Any] = {"name": "occurredAt_1"}
        if ttl_seconds is not None:
            options["expireAfterSeconds"] = ttl_seconds
        self.collection.create_index([(self.fields.occurred_at, ASCENDING)], **options)
        done.append(f"index occurredAt_1 on {self.fields.occurred_at}"
                    + (f" (TTL {ttl_seconds}s)" if ttl_seconds is not None else ""))
        return done

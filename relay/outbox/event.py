"""The outbox document: the event model, its field names, and the one parser.

Field names are configurable (`FieldNames`), for outboxes written for other relays.
`parse()` is the one place that checks a document; a problem raises `MalformedEventError`
naming the field, which the relay turns into a poison event naming the event id. `decode()` reads
a document's raw BSON (as the change source hands it over) the one way the relay reads it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson import ObjectId
from bson.codec_options import CodecOptions, DatetimeConversion

from relay.outbox.trace import current_trace_headers

# How an outbox document's BSON decodes: dates as aware UTC datetimes, and dates outside years
# 1-9999 as DatetimeMS instead of failing the whole document (the generic envelope carries them as
# {"$date": {"$numberLong": ...}}, a typed one refuses them: relay.avro.mapping).
DOCUMENT_CODEC: CodecOptions[Any] = CodecOptions(
    tz_aware=True, tzinfo=dt.UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)


def decode(raw: bytes) -> dict[str, Any]:
    """An outbox document's raw BSON decoded with DOCUMENT_CODEC."""
    return bson.decode(raw, DOCUMENT_CODEC)


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


DEFAULT_FIELDS = FieldNames()


def _utcnow() -> dt.datetime:
    # BSON dates hold milliseconds: truncate so a round trip compares equal.
    now = dt.datetime.now(dt.UTC)
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
    def new(
        cls,
        aggregate_type: str,
        aggregate_id: str,
        event_type: str,
        payload: Mapping[str, Any],
        *,
        trace_context: bool = True,
        **kw: Any,
    ) -> OutboxEvent:
        """A new event; with `trace_context` (default) and OpenTelemetry installed, the active
        span's W3C trace context is recorded in `headers` (`traceparent`, `tracestate`; headers
        given in `headers` win). Without OpenTelemetry nothing changes (relay.outbox.trace)."""
        if trace_context and (trace := current_trace_headers()):
            kw["headers"] = {**trace, **(kw.get("headers") or {})}
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
        return value
    if value is None:
        raise MalformedEventError(name, _absent(doc, name))
    if not isinstance(value, str) or not value:
        raise MalformedEventError(name, f"must be a non-empty string, got {type(value).__name__}")
    return value


def _absent(doc: Mapping[str, Any], name: str) -> str:
    """How a field without a value is described: "is null" when present as null, else "is missing"."""
    return "is null" if name in doc else "is missing"


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
        raise MalformedEventError(
            fields.occurred_at, _absent(doc, fields.occurred_at) if occurred_at is None else "must be a date"
        )
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

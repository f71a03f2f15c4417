"""The event a handler receives: the outbox event's fields plus where Kafka delivered it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InboxEvent:
    """One decoded event, with `relay.outbox.OutboxEvent`'s field names plus its Kafka coordinates.

    `event_id` is the outbox document's `_id` as text (an ObjectId's hex form), the key the inbox
    records; `payload` is a dict (a generic envelope's Extended JSON text parsed by
    `bson.json_util`, a typed envelope's record as fastavro decodes it); `headers` are the outbox
    document's own headers (the Kafka headers outside the relay's reserved names), None when it
    had none. The same event delivered twice has the same `event_id` and different coordinates.
    """

    event_id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: dict[str, Any]
    occurred_at: dt.datetime
    headers: Mapping[str, str] | None
    topic: str
    partition: int
    offset: int

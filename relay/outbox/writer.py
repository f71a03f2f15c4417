"""The writer services use: add outbox events inside the service's own transaction.

A service writes its business document and an outbox event in one transaction:

    with client.start_session() as session, session.start_transaction():
        orders.insert_one(order, session=session)
        Outbox(db.outbox).add(OutboxEvent.new("order", order_id, "OrderCreated", payload),
                              session=session)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import CollectionInvalid

from relay.outbox.event import DEFAULT_FIELDS, FieldNames, OutboxEvent


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
        done.append(
            f"index occurredAt_1 on {self.fields.occurred_at}"
            + (f" (TTL {ttl_seconds}s)" if ttl_seconds is not None else "")
        )
        return done

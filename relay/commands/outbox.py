"""`outbox-relay outbox init`: create the outbox collection and its index."""

from __future__ import annotations

from relay.config import Settings
from relay.mongo.connection import check_mongodb, mongo_client
from relay.outbox import Outbox


def init_outbox(settings: Settings, ttl_seconds: int | None = None) -> list[str]:
    """Create the collection and the index on the occurrence time (a TTL index with
    `ttl_seconds`); returns one line per thing done."""
    parts = settings.parts()
    with mongo_client(parts.mongo) as client:
        check_mongodb(client, parts.mongo)
        coll = client[settings.database][settings.outbox_collection]
        return Outbox(coll, parts.encoding.fields).init(ttl_seconds)

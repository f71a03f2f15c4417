"""The inbox: exactly-once effects for a service that consumes the relay's topics into MongoDB.

    from relay.inbox import Inbox

    def handle(event, session):          # event: InboxEvent; session: inside a MongoDB transaction
        db.shipments.update_one({"_id": event.aggregate_id},
                                {"$push": {"orders": event.payload}}, upsert=True, session=session)

    Inbox(db.inbox).run(handle, topics=["outbox.event.order"], group_id="shipping",
                        bootstrap_servers="localhost:9092")

Modules, one concern each: `event` (InboxEvent), `decoding` (messages -> events), `batching` (the
pure rules: what runs, what is skipped, which offsets are committed), `store` (the MongoDB
transaction), `consumer` (the Kafka side), `errors` (what retries the batch), `poison` and
`deadletters` (the poison policy), `metrics`, `config` (run's options), `inbox` (the steps in
order). docs/inbox.md has the guarantee.
"""

from __future__ import annotations

from relay.inbox.event import InboxEvent
from relay.inbox.inbox import Inbox
from relay.inbox.poison import InboxPoisonError

__all__ = ["Inbox", "InboxEvent", "InboxPoisonError"]

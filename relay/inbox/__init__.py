"""The inbox: exactly-once effects for a service that consumes the relay's topics into MongoDB.

    from relay.inbox import Inbox

    def handle(event, session):          # event: InboxEvent; session: inside a MongoDB transaction
        db.shipments.update_one({"_id": event.aggregate_id},
                                {"$push": {"orders": event.payload}}, upsert=True, session=session)

    Inbox(db.inbox).run(handle, topics=["outbox.event.order"], group_id="shipping",
                        bootstrap_servers="localhost:9092")

asyncio services: `AsyncInbox(db.inbox)` over an AsyncCollection, `await inbox.run(handle, ...)`
with `async def handle(event, session)` (an AsyncClientSession): the same contract and records.

Modules, one concern each: `event` (InboxEvent), `decoding` (messages -> events), `batching` (the
pure rules: what runs, what is skipped, which offsets are committed, when a batch is complete),
`steps` (the order of a batch's steps, written once for both forms), `records` (the inbox
records), `store` / `async_store` (the MongoDB transaction), `consumer` (the Kafka side), `jetstream`
and `rabbitmq` (the other brokers' sides), `sources` (which side a run's options choose), `errors`
(what retries the batch, what is poison), `retrying` (how a batch is retried), `stopping`,
`poison` and `deadletters` (the poison policy), `metrics`, `config` (run's options), `inbox` and
`async_inbox` (each form's run and the driver of its steps), `forget` (`outbox-relay inbox forget`:
a group's records selected by the replay's filters, deleted). docs/inbox.md has the guarantee.
"""

from __future__ import annotations

from relay.inbox.async_inbox import AsyncInbox
from relay.inbox.event import InboxEvent
from relay.inbox.inbox import Inbox
from relay.inbox.poison import InboxPoisonError

__all__ = ["AsyncInbox", "Inbox", "InboxEvent", "InboxPoisonError"]

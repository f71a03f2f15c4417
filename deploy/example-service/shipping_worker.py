"""An asyncio worker consuming the order service's events through `AsyncInbox`: each
`OrderCreated` becomes a shipment, exactly once, whatever the relay redelivers.

The handler writes through the session it is given, inside the inbox's MongoDB transaction (the
event's inbox record commits with it): a redelivered event is skipped, never shipped twice.

Environment: MONGODB_URI (mongodb://localhost:27017/?replicaSet=rs0), DATABASE (shop),
KAFKA_BOOTSTRAP_SERVERS (localhost:9092), ORDER_TOPIC (outbox.event.order), GROUP_ID (shipping).
Stops on SIGTERM or SIGINT (after the batch in hand), then prints what it did.

    python deploy/example-service/shipping_worker.py
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from pymongo import AsyncMongoClient

from relay.inbox import AsyncInbox, InboxEvent


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        os.environ.get("MONGODB_URI", "mongodb://localhost:27017/?replicaSet=rs0"), tz_aware=True
    )
    db = client[os.environ.get("DATABASE", "shop")]
    topic, group = os.environ.get("ORDER_TOPIC", "outbox.event.order"), os.environ.get("GROUP_ID", "shipping")

    async def ship(event: InboxEvent, session: Any) -> None:
        if event.event_type != "OrderCreated":
            return
        await db.shipments.update_one(
            {"_id": event.aggregate_id},
            {"$set": {"amount": event.payload["amount"], "status": "to-ship"}, "$push": {"events": event.event_id}},
            upsert=True,
            session=session,
        )

    inbox = AsyncInbox(db.shipping_inbox)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, inbox.stop)
    print(f"shipping-worker: consuming {topic} as {group}", flush=True)
    try:
        await inbox.run(
            ship,
            topics=[topic],
            group_id=group,
            bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
        )
    finally:
        labels = {"group": group, "topic": topic}
        shipped = inbox.registry.get_sample_value("relay_inbox_events_processed_total", labels) or 0
        skipped = inbox.registry.get_sample_value("relay_inbox_duplicates_skipped_total", labels) or 0
        print(f"shipping-worker: stopped: {shipped:.0f} events applied, {skipped:.0f} duplicates skipped", flush=True)
        await client.close()


if __name__ == "__main__":
    asyncio.run(main())

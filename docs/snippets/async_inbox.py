import asyncio
import os
import signal

from pymongo import AsyncMongoClient

from relay.inbox import AsyncInbox

db = AsyncMongoClient(os.environ.get("RELAY_MONGODB_URI", "mongodb://localhost:27017/?replicaSet=rs0")).app


async def handle(event, session):           # session: AsyncClientSession, inside the transaction
    await db.shipments.update_one({"_id": event.aggregate_id},
                                  {"$push": {"orders": event.payload}}, upsert=True, session=session)
    print(f"applied {event.event_type} {event.aggregate_id}: {event.payload}", flush=True)


async def main() -> None:
    inbox = AsyncInbox(db.inbox)
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, inbox.stop)
    print("shipping: consuming outbox.event.order (Ctrl-C stops)", flush=True)
    await inbox.run(handle, topics=["outbox.event.order"], group_id="shipping",
                    bootstrap_servers=os.environ.get("RELAY_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
    print("shipping: stopped")  # run returned: inbox.stop() (SIGTERM, SIGINT); cancelling the task raises


asyncio.run(main())

import asyncio
import os

from pymongo import AsyncMongoClient

from relay import AsyncOutbox, OutboxEvent

client = AsyncMongoClient(os.environ.get("RELAY_MONGODB_URI", "mongodb://localhost:27017/?replicaSet=rs0"))
db = client.app
outbox = AsyncOutbox(db.outbox)


async def create_order(order_id: str, amount: float) -> None:
    async def write(session):               # retried whole on transient errors
        await db.orders.insert_one({"_id": order_id, "amount": amount}, session=session)
        await outbox.add(OutboxEvent.new("order", order_id, "OrderCreated",
                                         {"orderId": order_id, "amount": amount, "step": 1}), session=session)
    async with client.start_session() as session:
        await session.with_transaction(write)


asyncio.run(create_order("o-2", 20.0))

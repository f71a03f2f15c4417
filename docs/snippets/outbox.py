import os

from pymongo import MongoClient

from relay import Outbox, OutboxEvent

client = MongoClient(os.environ.get("RELAY_MONGODB_URI", "mongodb://localhost:27017/?replicaSet=rs0"))
db = client.app
outbox = Outbox(db.outbox)

with client.start_session() as session, session.start_transaction():
    db.orders.insert_one({"_id": "o-1", "amount": 12.5}, session=session)
    outbox.add(OutboxEvent.new("order", "o-1", "OrderCreated", {"orderId": "o-1", "amount": 12.5, "step": 1}),
               session=session)

import os

from pymongo import MongoClient

from relay.inbox import Inbox

db = MongoClient(os.environ.get("RELAY_MONGODB_URI", "mongodb://localhost:27017/?replicaSet=rs0")).app


def handle(event, session):                 # event: relay.inbox.InboxEvent, inside a transaction
    db.shipments.update_one({"_id": event.aggregate_id},
                            {"$push": {"orders": event.payload}}, upsert=True, session=session)
    print(f"applied {event.event_type} {event.aggregate_id}: {event.payload}", flush=True)


print("shipping: consuming outbox.event.order (Ctrl-C stops)", flush=True)
Inbox(db.inbox).run(handle, topics=["outbox.event.order"], group_id="shipping",
                    bootstrap_servers=os.environ.get("RELAY_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
print("shipping: stopped")  # run returned: SIGTERM, SIGINT, or inbox.stop() from another thread

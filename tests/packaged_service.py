"""A service using the installed package only (tests/integration/test_packaging.py runs it with the
Python of a fresh virtual environment, from a folder outside the checkout): it imports nothing of
tests/ and nothing but `relay`, pymongo and the standard library.

    python packaged_service.py write URI DATABASE AGGREGATES STEPS
        for each of AGGREGATES orders, STEPS business writes, each with its outbox event
        (`Outbox.add`) in one transaction
    python packaged_service.py consume URI DATABASE TOPIC GROUP BOOTSTRAP
        the shipping side: `Inbox.run` records each order's steps, until SIGTERM
"""

from __future__ import annotations

import sys

import pymongo

from relay import Outbox, OutboxEvent
from relay.inbox import Inbox


def write(uri: str, database: str, aggregates: int, steps: int) -> None:
    client: pymongo.MongoClient = pymongo.MongoClient(uri, tz_aware=True)
    db = client[database]
    outbox = Outbox(db.outbox)
    for step in range(1, steps + 1):
        for n in range(aggregates):
            order = f"o-{n}"
            with client.start_session() as session, session.start_transaction():
                db.orders.update_one({"_id": order}, {"$set": {"step": step}}, upsert=True, session=session)
                outbox.add(OutboxEvent.new("order", order, "OrderStepped", {"orderId": order, "step": step}),
                           session=session)
    client.close()


def consume(uri: str, database: str, topic: str, group: str, bootstrap: str) -> None:
    db = pymongo.MongoClient(uri, tz_aware=True)[database]

    def handle(event, session):  # type: ignore[no-untyped-def]
        db.shipments.update_one({"_id": event.aggregate_id}, {"$push": {"steps": event.payload["step"]}},
                                upsert=True, session=session)

    Inbox(db.inbox).run(handle, topics=[topic], group_id=group, bootstrap_servers=bootstrap)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "write":
        write(args[0], args[1], int(args[2]), int(args[3]))
    else:
        consume(*args[:5])

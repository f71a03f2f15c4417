"""An asyncio order service: `POST /orders` writes the order and its `OrderCreated` event in one
MongoDB transaction through `AsyncOutbox`; the relay publishes the event, `shipping_worker.py`
consumes it. Standard library HTTP (asyncio streams), PyMongo's AsyncMongoClient, nothing else.

    POST /orders   {"orderId": "o-1", "amount": 12.5}   -> 201 {"orderId": ..., "eventId": ...}
                   orderId optional (a new one); a bad body -> 400, an existing orderId -> 409,
                   and then neither the order nor its event is written
    GET  /healthz  -> 200

Environment: MONGODB_URI (mongodb://localhost:27017/?replicaSet=rs0), DATABASE (shop),
OUTBOX_COLLECTION (outbox), HTTP_HOST (127.0.0.1), HTTP_PORT (8000; 0 picks a free port). It
prints `listening on HOST:PORT` once it serves, and stops on SIGTERM or SIGINT.

    python deploy/example-service/orders_api.py
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import DuplicateKeyError

from relay import AsyncOutbox, OutboxEvent

MAX_BODY = 64 * 1024


class BadRequest(ValueError):
    """Raised when a request's body is not an order."""


class Orders:
    """The service's one use case: an order and its event, committed together or not at all."""

    def __init__(self, client: AsyncMongoClient[Any], database: str, outbox_collection: str) -> None:
        self.client = client
        self.db = client[database]
        self.outbox = AsyncOutbox(self.db[outbox_collection])

    async def create(self, order_id: str, amount: float) -> str:
        event = OutboxEvent.new("order", order_id, "OrderCreated", {"orderId": order_id, "amount": amount, "step": 1})

        async def write(session: Any) -> None:  # retried whole by with_transaction on transient errors
            await self.db.orders.insert_one({"_id": order_id, "amount": amount}, session=session)
            await self.outbox.add(event, session=session)

        async with self.client.start_session() as session:
            await session.with_transaction(write)
        return event.id_str


def parse_order(body: bytes) -> tuple[str, float]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    amount = doc.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
        raise BadRequest("amount must be a positive number")
    order_id = doc.get("orderId") or f"o-{uuid.uuid4().hex[:12]}"
    if not isinstance(order_id, str):
        raise BadRequest("orderId must be a string")
    return order_id, float(amount)


async def respond(writer: asyncio.StreamWriter, status: str, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    writer.write(head.encode() + data)
    await writer.drain()


async def serve_one(orders: Orders, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request per connection (Connection: close)."""
    try:
        method, path, _ = (await reader.readline()).decode("latin-1").split(" ", 2)
        length = 0
        while (line := (await reader.readline()).strip()) != b"":
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if length > MAX_BODY:
            await respond(writer, "413 Payload Too Large", {"error": "body too large"})
            return
        body = await reader.readexactly(length) if length else b""
        if (method, path) == ("GET", "/healthz"):
            await respond(writer, "200 OK", {"status": "ok"})
        elif (method, path) == ("POST", "/orders"):
            order_id, amount = parse_order(body)
            event_id = await orders.create(order_id, amount)
            await respond(writer, "201 Created", {"orderId": order_id, "eventId": event_id})
        else:
            await respond(writer, "404 Not Found", {"error": f"no route {method} {path}"})
    except BadRequest as exc:
        await respond(writer, "400 Bad Request", {"error": str(exc)})
    except DuplicateKeyError:
        await respond(writer, "409 Conflict", {"error": "order exists"})
    except (ValueError, asyncio.IncompleteReadError) as exc:
        await respond(writer, "400 Bad Request", {"error": f"malformed request: {exc}"})
    finally:
        writer.close()


async def main() -> None:
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        os.environ.get("MONGODB_URI", "mongodb://localhost:27017/?replicaSet=rs0"), tz_aware=True
    )
    orders = Orders(client, os.environ.get("DATABASE", "shop"), os.environ.get("OUTBOX_COLLECTION", "outbox"))
    for line in await orders.outbox.init():  # the collection and its index, once
        print(f"orders-api: {line}", flush=True)
    server = await asyncio.start_server(
        lambda r, w: serve_one(orders, r, w),
        os.environ.get("HTTP_HOST", "127.0.0.1"),
        int(os.environ.get("HTTP_PORT", "8000")),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"orders-api: listening on {host}:{port}", flush=True)
    async with server:
        await stop.wait()
    await client.close()
    print("orders-api: stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())

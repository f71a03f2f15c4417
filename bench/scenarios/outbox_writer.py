"""The async writer's overhead: `AsyncOutbox.add` beside a bare `insert_one` in the same
transaction (reported, never asserted).

Run: as part of `make bench` with the inbox scenario (`python -m bench.run`, also with
`--only-inbox`), or alone: `.venv/bin/python -m bench.scenarios.outbox_writer [--transactions 1000]
[--rounds 5]` (a local stack of its own, stopped and deleted at the end; `--mongodb-uri` uses a
running replica set instead).

Each transaction (AsyncMongoClient, `session.with_transaction`) writes an order document, then the
order's event twice: once through `AsyncOutbox.add` (into the outbox collection) and once as the
same document through a bare `insert_one` (into a second collection), each call timed alone; the
two calls alternate which goes first from one transaction to the next. The event and the bare
document are built before the timing: what is timed is the writer's call against the driver's
call, on the same session, in the same transaction. Each round gives the median of each call; the
result is the median of the rounds' medians, and the overhead the ratio of the two minus one.
Goal (issue 35): under 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

from pymongo import AsyncMongoClient

from bench.common import progress
from relay import AsyncOutbox, OutboxEvent

ADD = "AsyncOutbox.add"
BARE = "bare insert_one"


async def _round(client: AsyncMongoClient[Any], database: str, transactions: int) -> dict[str, float]:
    """One round: `transactions` transactions; the median microseconds of each call."""
    db = client[database]
    outbox, bare = AsyncOutbox(db.outbox), db.outbox_bare
    times: dict[str, list[float]] = {ADD: [], BARE: []}
    async with client.start_session() as session:
        for n in range(transactions):
            order = f"o-{uuid.uuid4().hex[:10]}"
            event = OutboxEvent.new("order", order, "OrderCreated", {"orderId": order, "amount": 9.5, "step": 1})
            doc = event.to_document()  # the same document, for the bare insert

            async def write(s: Any, event: OutboxEvent = event, doc: dict[str, Any] = doc, n: int = n) -> None:
                await db.orders.insert_one({"_id": doc["aggregateId"], "amount": 9.5}, session=s)
                calls = [(ADD, lambda: outbox.add(event, session=s)), (BARE, lambda: bare.insert_one(doc, session=s))]
                for name, call in calls if n % 2 == 0 else calls[::-1]:
                    started = time.perf_counter()
                    await call()
                    times[name].append((time.perf_counter() - started) * 1e6)

            await session.with_transaction(write)
    return {name: statistics.median(values) for name, values in times.items()}


def writer_overhead(uri: str, transactions: int = 1000, rounds: int = 5) -> dict[str, Any]:
    """`rounds` rounds of `transactions` transactions, each in a fresh database; the results."""

    async def main() -> list[dict[str, float]]:
        client: AsyncMongoClient[Any] = AsyncMongoClient(uri, tz_aware=True)
        results = []
        try:
            for r in range(rounds):
                database = f"bench_writer_{uuid.uuid4().hex[:6]}"
                await client[database].create_collection("outbox")
                await client[database].create_collection("outbox_bare")
                await client[database].create_collection("orders")
                progress(f"[writer] round {r + 1}/{rounds}: {transactions} transactions")
                results.append(await _round(client, database, transactions))
                await client.drop_database(database)
        finally:
            await client.close()
        return results

    load = [os.getloadavg()]
    runs = asyncio.run(main())
    load.append(os.getloadavg())
    median = {name: statistics.median(r[name] for r in runs) for name in (ADD, BARE)}
    return {"transactions": transactions, "rounds": rounds, "runs": runs, "median_us": median,
            "overhead": median[ADD] / median[BARE] - 1, "load_average": load}


def format_writer(result: dict[str, Any]) -> list[str]:
    """The scenario's lines: each call's median microseconds and the overhead with its goal."""
    if not result:
        return []
    lines = [f"async writer: {result['transactions']} transactions x {result['rounds']} rounds, each call timed "
             "in the same transaction (order alternating), medians of the rounds' medians"]
    for name, value in result["median_us"].items():
        rounds = ", ".join(f"{r[name]:.0f}" for r in result["runs"])
        lines.append(f"  {name:<18} {value:>7.0f} us per call   (rounds: {rounds})")
    lines.append(f"  overhead of AsyncOutbox.add = {result['overhead']:+.1%}   (goal < 10%)")
    start, end = result["load_average"]
    lines.append(f"  load average (1 min) at start {start[0]:.2f}, at end {end[0]:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.outbox_writer", description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mongodb-uri", default="")
    args = parser.parse_args(argv)
    if args.transactions < 1 or args.rounds < 1:
        parser.error("--transactions and --rounds must be at least 1")
    if args.mongodb_uri:  # a server of the caller's
        result = writer_overhead(args.mongodb_uri, args.transactions, args.rounds)
    else:
        from bench.stack import bench_stack

        with bench_stack() as (stack, _client):
            result = writer_overhead(stack.mongo.uri, args.transactions, args.rounds)
    print("\n".join(format_writer(result)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

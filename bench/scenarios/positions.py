"""How often the relay writes its positions (issue 44, RELAY_CHECKPOINT_INTERVAL_MS): the oplog
entries of the lease collection per second and per 1,000 events, for N outboxes led by one process
and several intervals. Counts, which a shared, noisy machine does not blur (no CPU figures).
Reported, never asserted.

Run alone, on the benchmark's stack (`bench.stack`): `.venv/bin/python -m bench.scenarios.positions
[--outboxes 1,5,20] [--intervals 0,200,1000,5000] [--rate 300] [--seconds 10]` (results also in
`bench/results/positions.json`).

For each N and interval: a fresh database with N outboxes; one `outbox-relay run` process listing
them (RELAY_OUTBOXES), started at "now", waited for until it holds every lease and stored each
first position; then a writer inserts `--rate` events a second in all, one insert at a time, the
outboxes in turn, for `--seconds`; the window closes once every event is in Kafka. In that window:
the oplog entries that write a lease document (plain updates: a renewal, or one position stored
alone; and transactions' `applyOps` entries: positions stored together), the positions they
stored, and mongod's `update` opcounter.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bson import Timestamp
from pymongo import MongoClient

from bench.common import RESULTS_DIR, consumer, create_topic, in_kafka, progress, wait_for
from bench.events import EventFactory
from bench.relay_under_test import relay_settings
from bench.scenarios.backlog import last_oplog_write
from bench.scenarios.outboxes import create_outboxes, opcounters
from bench.stack import bench_stack
from harness.relays import RelayProcess
from relay.dev.stack import LocalStack

COUNTS = (1, 5, 20)
INTERVALS_MS = (0, 200, 1000, 5000)


@dataclass
class Row:
    outboxes: int
    interval_ms: int
    events: int
    seconds: float
    lease_writes: int  # oplog entries writing a lease document
    positions: int  # positions those entries stored (a transaction stores several)
    updates: int  # mongod's `update` opcounter over the window

    @property
    def writes_per_s(self) -> float:
        return self.lease_writes / self.seconds

    @property
    def writes_per_1000_events(self) -> float:
        return 1000 * self.lease_writes / self.events

    @property
    def updates_per_1000_events(self) -> float:
        return 1000 * self.updates / self.events


def lease_writes(client: MongoClient[Any], namespace: str, since: Timestamp, until: Timestamp) -> tuple[int, int]:
    """Oplog entries in (since, until] writing a document of `namespace`, and the positions stored
    (updates setting `resumeToken`; inside transactions, each one of the applyOps)."""
    oplog = client.local["oplog.rs"]
    window = {"ts": {"$gt": since, "$lte": until}}
    entries = positions = 0
    for entry in oplog.find({**window, "ns": namespace, "op": "u"}):
        entries += 1
        positions += "resumeToken" in str(entry.get("o", {}))
    for entry in oplog.find({**window, "op": "c", "o.applyOps.ns": namespace}):
        entries += 1
        positions += sum(1 for op in entry["o"]["applyOps"] if op.get("ns") == namespace and op.get("op") == "u")
    return entries, positions


def measure(stack: LocalStack, client: MongoClient[Any], n: int, interval_ms: int, rate: int, seconds: float,
            tag: str) -> Row:
    database = f"pos_{tag}_{n}_{interval_ms}"
    outboxes, writer = create_outboxes(client, database, n)
    topic = f"bench-pos-{tag}-{n}-{interval_ms}"
    create_topic(stack.kafka.bootstrap_servers, topic)
    settings = relay_settings(stack, database, topic, "now").replace(
        outboxes=",".join(outboxes.namespaces), checkpoint_interval_ms=interval_ms, instance_id=f"pos-{tag}")
    leases = client[database][settings.lease_collection]
    logs = Path(tempfile.mkdtemp(prefix="bench-positions-"))
    relay = RelayProcess(settings, logs, "relay").start()
    try:
        wait_for("every lease held, with a position", lambda: leases.count_documents(
            {"owner": settings.instance_id, "resumeToken": {"$exists": True}}) == n, 120)
        factory, total = EventFactory(200), int(rate * seconds)
        since, ops = last_oplog_write(client), opcounters(client)
        started = time.perf_counter()
        for i in range(total):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            writer.add_many([factory.event(i)])
        with consumer(stack.kafka.bootstrap_servers) as c:
            wait_for(f"{total} events in {topic}", lambda: in_kafka(c, topic) >= total, 180)
        elapsed = time.perf_counter() - started
        entries, positions = lease_writes(client, leases.full_name, since, last_oplog_write(client))
        updates = opcounters(client, ops)["update"]
    finally:
        relay.stop()
        shutil.rmtree(logs, ignore_errors=True)
        client.drop_database(database)
    return Row(n, interval_ms, total, elapsed, entries, positions, updates)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios.positions", description=__doc__.split("\n\n")[0])
    p.add_argument("--outboxes", default=",".join(map(str, COUNTS)), help="outbox counts N (default 1,5,20)")
    p.add_argument("--intervals", default=",".join(map(str, INTERVALS_MS)),
                   help="RELAY_CHECKPOINT_INTERVAL_MS values (default 0,200,1000,5000)")
    p.add_argument("--rate", type=int, default=300, help="events a second in all (default 300)")
    p.add_argument("--seconds", type=float, default=10, help="how long the writer writes (default 10)")
    args = p.parse_args(argv)
    rows: list[Row] = []
    with bench_stack() as (stack, client):
        tag = uuid.uuid4().hex[:6]
        for n in (int(x) for x in args.outboxes.split(",")):
            for interval in (int(x) for x in args.intervals.split(",")):
                row = measure(stack, client, n, interval, args.rate, args.seconds, tag)
                progress(f"N={n} interval={interval} ms: {row.lease_writes} lease writes "
                         f"({row.writes_per_s:.1f}/s, {row.writes_per_1000_events:.1f} per 1,000 events), "
                         f"{row.positions} positions, {row.updates_per_1000_events:.1f} updates per 1,000 events")
                rows.append(row)
    print("| N | interval ms | events | s | lease writes/s | per 1,000 events | positions per write | updates per 1,000 events |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        per = r.positions / r.lease_writes if r.lease_writes else 0.0
        print(f"| {r.outboxes} | {r.interval_ms} | {r.events} | {r.seconds:.1f} | {r.writes_per_s:.2f} | "
              f"{r.writes_per_1000_events:.1f} | {per:.1f} | {r.updates_per_1000_events:.1f} |")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "positions.json"
    path.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    progress(f"results: {path}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

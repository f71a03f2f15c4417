"""How RELAY_CHECKPOINT_MAX_EVENTS bounds the duplicate window (issue 50): for each count, the
checkpoint writes per second during a catch-up and at a steady rate, and the most events
acknowledged between two stored checkpoints during the catch-up (what a kill there publishes again,
at most, besides what is in flight). Counts from the oplog, which a shared, noisy machine does not
blur. Reported, never asserted.

Run alone, on a stack of its own: `.venv/bin/python -m bench.scenarios.checkpoint_count
[--counts 1000,5000,10000,50000,0] [--backlog 100000] [--rate 500] [--seconds 10]` (0: no count,
the interval alone; results also in `bench/results/checkpoint_count.json`).

For each count: a fresh database and outbox; a backlog written before the relay starts (its
RELAY_START_AT just before it), the relay (`outbox-relay run`, RELAY_CHECKPOINT_INTERVAL_MS=1000)
catching up, timed until every event is in Kafka; then a writer at `--rate` events a second for
`--seconds`. In each window: the oplog entries that store a checkpoint (bench.scenarios.positions'
`lease_writes`), and, for the catch-up, the stored checkpoints' cluster times against the outbox's
inserts: the most inserts between two consecutive ones.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
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

from bench.common import RESULTS_DIR, consumer, create_topic, in_kafka, progress, wait_for, warm_up_kafka
from bench.events import EventFactory
from bench.relay_under_test import relay_settings
from bench.scenarios.backlog import last_oplog_write
from bench.scenarios.positions import lease_writes
from harness.relays import RelayProcess
from relay.dev.stack import LocalStack
from relay.outbox import Outbox

COUNTS = (1000, 5000, 10000, 50000, 0)
NO_COUNT = 10**12  # "0" on the command line: the interval alone decides


@dataclass
class Row:
    max_events: int  # 0: none
    backlog: int
    catch_up_s: float
    catch_up_writes: int
    largest_gap: int  # most events between two consecutive stored checkpoints during the catch-up
    steady_rate: int
    steady_s: float
    steady_writes: int

    @property
    def catch_up_rate(self) -> float:
        return self.backlog / self.catch_up_s

    @property
    def catch_up_writes_per_s(self) -> float:
        return self.catch_up_writes / self.catch_up_s

    @property
    def steady_writes_per_s(self) -> float:
        return self.steady_writes / self.steady_s


def stored_times(client: MongoClient[Any], namespace: str, since: Timestamp, until: Timestamp) -> list[Timestamp]:
    """The cluster times of the checkpoints stored in (since, until], from the oplog, in order."""
    oplog, window = client.local["oplog.rs"], {"ts": {"$gt": since, "$lte": until}}
    found: list[Timestamp] = []
    for entry in oplog.find({**window, "$or": [{"ns": namespace, "op": "u"}, {"op": "c", "o.applyOps.ns": namespace}]}):
        ops = entry["o"]["applyOps"] if entry["op"] == "c" else [entry]
        for op in ops:
            text = op.get("o", {})
            diff = text.get("diff", {}).get("u", {}) if isinstance(text, dict) else {}
            stored = diff.get("tokenClusterTime") or (text.get("$set", {}) if isinstance(text, dict) else {}).get(
                "tokenClusterTime")
            if isinstance(stored, Timestamp):
                found.append(stored)
    return sorted(found)


def largest_gap(client: MongoClient[Any], outbox: str, stored: list[Timestamp], since: Timestamp) -> int:
    """The most inserts into `outbox` between two consecutive stored cluster times (from `since`)."""
    oplog = client.local["oplog.rs"]
    bounds = [since, *stored]
    return max((oplog.count_documents({"ns": outbox, "op": "i", "ts": {"$gt": a, "$lte": b}})
                for a, b in itertools.pairwise(bounds)), default=0)  # fmt: skip


def measure(stack: LocalStack, client: MongoClient[Any], count: int, backlog: int, rate: int, seconds: float,
            tag: str) -> Row:
    database, topic = f"cnt_{tag}_{count}", f"bench-cnt-{tag}-{count}"
    create_topic(stack.kafka.bootstrap_servers, topic)
    outbox = client[database]["outbox"]
    writer, factory = Outbox(outbox), EventFactory(200)
    start_at = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)).isoformat()
    since = last_oplog_write(client)
    for first in range(0, backlog, 1000):
        writer.add_many([factory.event(i) for i in range(first, min(first + 1000, backlog))])
    settings = relay_settings(stack, database, topic, start_at).replace(
        checkpoint_interval_ms=1000, checkpoint_max_events=count or NO_COUNT, instance_id=f"cnt-{tag}")
    leases = client[database][settings.lease_collection]
    logs = Path(tempfile.mkdtemp(prefix="bench-checkpoint-count-"))
    relay = RelayProcess(settings, logs, "relay").start()
    try:
        with consumer(stack.kafka.bootstrap_servers) as c:
            wait_for("the first event in Kafka", lambda: in_kafka(c, topic) > 0, 120)
            started = time.perf_counter()
            wait_for(f"{backlog} events in {topic}", lambda: in_kafka(c, topic) >= backlog, 600)
            catch_up_s = time.perf_counter() - started
            caught_up = last_oplog_write(client)
            catch_up_writes, _ = lease_writes(client, leases.full_name, since, caught_up)
            gap = largest_gap(client, outbox.full_name, stored_times(client, leases.full_name, since, caught_up), since)
            time.sleep(2)  # the last interval's write lands outside the steady window
            steady_since, total = last_oplog_write(client), int(rate * seconds)
            began = time.perf_counter()
            for i in range(total):
                delay = began + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                writer.add_many([factory.event(backlog + i)])
            wait_for(f"{backlog + total} events in {topic}", lambda: in_kafka(c, topic) >= backlog + total, 120)
            steady_s = time.perf_counter() - began
            steady_writes, _ = lease_writes(client, leases.full_name, steady_since, last_oplog_write(client))
    finally:
        relay.stop()
        shutil.rmtree(logs, ignore_errors=True)
        client.drop_database(database)
    return Row(count, backlog, catch_up_s, catch_up_writes, gap, rate, steady_s, steady_writes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios.checkpoint_count", description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", default=",".join(map(str, COUNTS)), help="RELAY_CHECKPOINT_MAX_EVENTS values (0: none)")
    p.add_argument("--backlog", type=int, default=100_000, help="events of the catch-up (default 100,000)")
    p.add_argument("--rate", type=int, default=500, help="events a second after it (default 500)")
    p.add_argument("--seconds", type=float, default=10, help="how long the steady writer writes (default 10)")
    args = p.parse_args(argv)
    stack = LocalStack.in_temp_dir(partitions=3)
    progress(f"starting MongoDB and Kafka in {stack.base_dir}")
    rows: list[Row] = []
    try:
        stack.start()
        warm_up_kafka(stack.kafka.bootstrap_servers)
        with MongoClient(stack.mongo.uri, tz_aware=True) as client:
            tag = uuid.uuid4().hex[:6]
            for count in (int(x) for x in args.counts.split(",")):
                row = measure(stack, client, count, args.backlog, args.rate, args.seconds, tag)
                progress(f"count {count or 'none'}: catch-up {row.catch_up_rate:,.0f} ev/s, "
                         f"{row.catch_up_writes_per_s:.1f} writes/s, largest gap {row.largest_gap:,}; "
                         f"at {row.steady_rate}/s {row.steady_writes_per_s:.2f} writes/s")
                rows.append(row)
    finally:
        stack.stop()
        shutil.rmtree(stack.base_dir, ignore_errors=True)
    print("| RELAY_CHECKPOINT_MAX_EVENTS | catch-up ev/s | checkpoint writes/s (catch-up) | most events between two checkpoints | writes/s at steady rate |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r.max_events or 'none (interval only)'} | {r.catch_up_rate:,.0f} | {r.catch_up_writes_per_s:.1f} | "
              f"{r.largest_gap:,} | {r.steady_writes_per_s:.2f} at {r.steady_rate}/s |")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "checkpoint_count.json"
    path.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    progress(f"results: {path}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

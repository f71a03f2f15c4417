"""`outbox-relay replay` throughput (issue 43), beside the live relay's catch-up on the same data.

Run: `.venv/bin/python -m bench.replay [--events 20000] [--rounds 1]`.

On a fresh local stack: an outbox of `--events` events inserted now (in the oplog), which the live
relay publishes from the oplog's start (its catch-up, timed until every message is in Kafka) and
a replay then publishes again from the oplog; and a second outbox of `--events` events whose
occurredAt lies before the oplog's oldest entry, which a replay publishes from the collection.
Each replay runs in this process (`outbox-relay replay`, the command's own entry point) and is
timed by its summary line (`seconds`: planning, reading, encoding and publishing, every chunk
acknowledged); events/s = events / seconds. Then the live relay's p99 (commit to Kafka: the
message's create time minus occurredAt) for a writer at `--rate` events/s during `--seconds`,
alone and beside a replay of the first outbox's events. Prints one line per figure; asserts
nothing but the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import shutil
import tempfile
import threading
import time
from typing import Any

from pymongo import MongoClient

from bench.common import PARTITIONS, create_topic, percentile, progress
from bench.relay_under_test import relay_settings, running_relay
from bench.stack import bench_stack
from harness.topics import REGISTRY, read_messages, topic_size
from harness.waiting import wait_until
from relay.cli import main
from relay.dev.stack import LocalStack
from relay.outbox import Outbox, OutboxEvent

CHUNK = 1000


def _events(count: int, start: dt.datetime | None) -> list[OutboxEvent]:
    """`count` events over 1,000 aggregates, occurring from `start` a millisecond apart (None: now)."""
    extra: dict[str, Any] = {}
    events = []
    for i in range(count):
        if start is not None:
            extra = {"occurred_at": start + dt.timedelta(milliseconds=i)}
        events.append(OutboxEvent.new("bench", f"a{i % 1000}", "Changed", {"seq": i, "note": "x" * 100}, **extra))
    return events


def _insert(client: MongoClient[Any], database: str, events: list[OutboxEvent]) -> None:
    outbox = Outbox(client[database]["outbox"])
    for i in range(0, len(events), CHUNK):
        outbox.add_many(events[i : i + CHUNK])


def _replay(stack: LocalStack, database: str, template: str, since: dt.datetime, state: str) -> dict[str, Any]:
    """Run `outbox-relay replay` in this process; its summary line."""
    out = io.StringIO()
    args = ["replay", "--mongodb-uri", stack.mongo.uri, "--kafka-bootstrap-servers", stack.kafka.bootstrap_servers,
            "--database", database, "--topic-template", template, "--http-port", "0", "--log-level", "WARNING",
            "--since", since.isoformat(), "--state-dir", state]
    with contextlib.redirect_stdout(out):
        code = main(args)
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    if code != 0:
        raise RuntimeError(f"replay exited {code}: {out.getvalue()[-2000:]}")
    return lines[-1]


def _catch_up(stack: LocalStack, database: str, template: str, events: int) -> float:
    """Seconds the live relay takes to publish the outbox from the oplog's start."""
    settings = relay_settings(stack, database, template, "oplog-start")
    topic = template.format(aggregateType="bench")
    with running_relay(settings) as relay:
        started = time.monotonic()
        relay.start()
        wait_until(lambda: topic_size(stack.kafka.bootstrap_servers, topic) >= events, 600, "the catch-up",
                   interval=0.05, alive=relay.check_alive)
        return time.monotonic() - started


def run_round(stack: LocalStack, client: MongoClient[Any], events: int, n: int, state: str) -> dict[str, Any]:
    oplog = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"].as_datetime()
    live_db, old_db = f"replay_live_{n}", f"replay_old_{n}"
    live_template, old_template = f"replay{n}.live.{{aggregateType}}", f"replay{n}.old.{{aggregateType}}"
    for template in (live_template, old_template):
        create_topic(stack.kafka.bootstrap_servers, template.format(aggregateType="bench"))
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    progress(f"round {n}: writing {events} events, and {events} dated before the oplog")
    _insert(client, live_db, _events(events, None))
    old_start = oplog - dt.timedelta(hours=1)
    _insert(client, old_db, _events(events, old_start))

    progress(f"round {n}: the live relay's catch-up")
    catch_up_s = _catch_up(stack, live_db, live_template, events)
    progress(f"round {n}: replay from the oplog")
    from_oplog = _replay(stack, live_db, live_template, since, state)
    progress(f"round {n}: replay from the collection")
    from_collection = _replay(stack, old_db, old_template, old_start, state)
    topic = live_template.format(aggregateType="bench")
    assert from_oplog["summary"][f"{live_db}.outbox"][topic] == {"oplog": events, "collection": 0}, from_oplog
    old_topic = old_template.format(aggregateType="bench")
    assert from_collection["summary"][f"{old_db}.outbox"][old_topic] == {"oplog": 0, "collection": events}
    return {
        "since": since,
        "catch_up": events / catch_up_s,
        "oplog": events / from_oplog["seconds"],
        "collection": events / from_collection["seconds"],
    }


def _latencies_ms(stack: LocalStack, topic: str) -> list[float]:
    """Per message: the broker's timestamp (the producer's create time) minus the event's occurredAt."""
    values = []
    for msg in read_messages(stack.kafka.bootstrap_servers, topic):
        occurred = REGISTRY.decode(msg.value())["occurredAt"]
        values.append(msg.timestamp()[1] - occurred.timestamp() * 1000)
    return sorted(values)


def live_p99(stack: LocalStack, client: MongoClient[Any], rate: int, seconds: float, n: int, beside: Any) -> float:
    """The live relay's p99 (ms, commit to Kafka) for `rate` events/s written one per transaction
    during `seconds`, while `beside()` runs on another thread (None: alone)."""
    database, template = f"replay_p99_{n}", f"replay{n}.p99.{{aggregateType}}"
    topic = template.format(aggregateType="bench")
    create_topic(stack.kafka.bootstrap_servers, topic)
    outbox = Outbox(client[database]["outbox"])
    outbox.add(_events(1, None)[0])  # the collection exists before the relay watches it
    with running_relay(relay_settings(stack, database, template, "now")) as relay:
        relay.start()
        wait_until(lambda: topic_size(stack.kafka.bootstrap_servers, topic) >= 0, 30, "the relay")
        time.sleep(2)
        side = threading.Thread(target=beside, daemon=True) if beside else None
        if side:
            side.start()
        total, started = int(rate * seconds), time.monotonic()
        for i in range(total):
            time.sleep(max(0.0, started + i / rate - time.monotonic()))
            outbox.add(_events(1, None)[0])
        wait_until(lambda: topic_size(stack.kafka.bootstrap_servers, topic) >= total, 120, "the live events",
                   alive=relay.check_alive)
        if side:
            side.join()
    values = _latencies_ms(stack, topic)
    return percentile(values, 99)


def main_bench(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rate", type=int, default=300, help="the live writer's events/s for the p99 step")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the live writer writes")
    options = parser.parse_args(argv)
    state = tempfile.mkdtemp(prefix="bench-replay-")
    try:
        with bench_stack() as (stack, client):
            rounds = [run_round(stack, client, options.events, n, state) for n in range(1, options.rounds + 1)]
            since = rounds[0]["since"]
            progress(f"the live relay's p99 at {options.rate}/s alone, then beside a replay of {options.events} events")
            alone = live_p99(stack, client, options.rate, options.seconds, 1, None)
            beside = live_p99(stack, client, options.rate, options.seconds, 2, lambda: _replay(
                stack, "replay_live_1", "replay1.live.{aggregateType}", since, state))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(f"{options.events} events, {PARTITIONS} partitions, {options.rounds} round(s); events/s per round")
    for label, key in (("live relay catch-up (oplog)", "catch_up"), ("replay from the oplog", "oplog"),
                       ("replay from the collection", "collection")):
        print(f"{label:32} " + "  ".join(f"{r[key]:8,.0f}" for r in rounds))
    print(f"live relay p99 at {options.rate}/s, ms: alone {alone:.1f}, beside a replay {beside:.1f}")


if __name__ == "__main__":
    main_bench()

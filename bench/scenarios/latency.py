"""Steady-state latency: the relay running, a writer inserting at a fixed rate, per-event latency.

Latency of an event = the broker's append time of its Kafka message (topic created with
`message.timestamp.type=LogAppendTime`) minus the insert's oplog `wall` time (the server's
clock at the write, ms; same machine, same clock). The same messages are also measured from
the moment the writer's insert returned (its own clock), with the insert round trip as the
uncertainty of that second figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message
from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, consumer, create_topic, in_kafka, log, percentile, rate, read_topic, wait_for
from bench.events import EventFactory
from bench.relay_under_test import lease_token_data, relay_settings, running_relay
from bench.sampling import Sampler, stack_roles
from bench.writer import receive, writer_child
from relay.dev.stack import LocalStack
from relay.outbox import Outbox

WARM_UP_EVENTS = 100   # published and awaited before the measured ones


@dataclass
class Latency:
    """One steady-state step's result (ms; NaN when nothing was received)."""

    target_rate: float
    batch: int                 # events per insert (1: insert_one)
    written: int
    write_seconds: float
    achieved_rate: float       # events written / seconds the writer took
    received: int
    missing: int
    duplicates: int
    # From the insert's oplog wall time (server clock) to the broker's append: the headline.
    p50_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    # The same messages from the moment the writer's insert returned (writer's clock).
    returned_p50_ms: float
    returned_p99_ms: float
    returned_max_ms: float
    insert_p50_ms: float       # the insert round trip: the commit happened somewhere inside it
    insert_p99_ms: float
    insert_max_ms: float
    writer_max_behind_ms: float
    relay_cpu_us_per_event: float     # this process (relay thread + benchmark) during the writes
    mongod_cpu_us_per_event: float
    relay_peak_rss_mb: float
    other_cores: float


def steady_state(stack: LocalStack, client: MongoClient[Any], factory: EventFactory, payload_bytes: int,
                 rate_per_s: float, seconds: float, batch: int, run_id: str) -> Latency:
    """Relay running and warmed up (start_at=now); a writer process inserts at `rate_per_s`.

    Before the measured writes, WARM_UP_EVENTS are written and awaited in Kafka, so the relay's
    producer has its idempotence PID and metadata (its first batch waits for them; that is
    start-up, not steady state). The topic is read after the run, so consuming does not compete
    with the relay; append times are set by the broker, not by when they are read.
    """
    step = f"steady{int(rate_per_s)}"
    database = f"bench_{run_id}_{step}"
    topic_template = f"bench.{run_id}.{step}.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    create_topic(stack.kafka.bootstrap_servers, topic, {"message.timestamp.type": "LogAppendTime"})
    outbox = Outbox(client[database]["outbox"])
    outbox.init()
    settings = relay_settings(stack, database, topic_template, "now")
    leases = client[database][settings.lease_collection]
    with writer_child(stack.mongo.uri, database, rate_per_s, seconds, payload_bytes, batch) as conn, \
            running_relay(settings) as runner, consumer(stack.kafka.bootstrap_servers) as c:
        runner.start()
        # With start_at=now and no checkpoint the relay stores its opening token at once:
        # once it is there the stream is open and every later insert will be published.
        wait_for("relay stream open", lambda: lease_token_data(leases, settings.namespace)[0], 60,
                 runner.check_alive)
        warm_up_ids = {str(i) for i in outbox.add_many(factory.event(-1 - i) for i in range(WARM_UP_EVENTS))}
        wait_for("warm-up events in Kafka", lambda: in_kafka(c, topic) >= WARM_UP_EVENTS, 60, runner.check_alive)
        receive(conn, 60, "ready")
        with Sampler(stack_roles(stack)) as sampler:
            conn.send("go")
            result = receive(conn, seconds * 3 + 120, "result")
            expected = WARM_UP_EVENTS + len(result["committed"])
            wait_for("steady-state events in Kafka", lambda: in_kafka(c, topic) >= expected, 120,
                     runner.check_alive)
        usage = sampler.stop()
    messages = read_topic(stack.kafka.bootstrap_servers, topic, expected)
    written = len(result["committed"])
    walls = oplog_wall_times(client, settings.namespace)
    from_wall, from_returned, duplicates = latencies(messages, result["committed"], walls, warm_up_ids)
    round_trips = sorted(t * 1000 for t in result["round_trips"])
    return Latency(
        target_rate=rate_per_s, batch=batch, written=written, write_seconds=result["seconds"],
        achieved_rate=rate(written, result["seconds"]), received=len(from_returned),
        missing=written - len(from_returned), duplicates=duplicates,
        p50_ms=percentile(from_wall, 50), p99_ms=percentile(from_wall, 99),
        max_ms=from_wall[-1] if from_wall else math.nan, min_ms=from_wall[0] if from_wall else math.nan,
        returned_p50_ms=percentile(from_returned, 50), returned_p99_ms=percentile(from_returned, 99),
        returned_max_ms=from_returned[-1] if from_returned else math.nan,
        insert_p50_ms=percentile(round_trips, 50), insert_p99_ms=percentile(round_trips, 99),
        insert_max_ms=round_trips[-1] if round_trips else math.nan,
        writer_max_behind_ms=result["max_behind_s"] * 1000,
        relay_cpu_us_per_event=usage.cpu_us_per_event("bench", written),
        mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", written),
        relay_peak_rss_mb=usage.peak_rss_mb.get("bench", math.nan), other_cores=usage.other_cores,
    )


def oplog_wall_times(client: MongoClient[Any], namespace: str) -> dict[str, float]:
    """Event id -> `wall` (server wall clock, ms) of its insert's oplog entry, as Unix seconds."""
    entries = client.local["oplog.rs"].find({"ns": namespace, "op": "i"}, {"o._id": 1, "wall": 1})
    return {str(e["o"]["_id"]): e["wall"].timestamp() for e in entries if "wall" in e}


def latencies(messages: list[Message], committed: dict[str, float], walls: dict[str, float],
              warm_up_ids: set[str]) -> tuple[list[float], list[float], int]:
    """(from oplog wall, from insert returned) in ms, ascending, and the duplicate count.

    Messages are matched to writes by their `ce_id` header (the event id); a repeated id is a
    duplicate and counts once, at its first append.
    """
    from_wall: list[float] = []
    from_returned: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    for m in messages:
        kind, append_ms = m.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError("steady-state topic does not carry LogAppendTime timestamps")
        event_id = dict(m.headers() or []).get("ce_id", b"").decode()
        if event_id in seen:
            duplicates += 1
            continue
        seen.add(event_id)
        returned = committed.get(event_id)
        if returned is not None:
            from_returned.append(append_ms - returned * 1000.0)
            if event_id in walls:
                from_wall.append(append_ms - walls[event_id] * 1000.0)
        elif event_id not in warm_up_ids:
            log.warning("steady state: message for unknown event %s", event_id)
    return sorted(from_wall), sorted(from_returned), duplicates

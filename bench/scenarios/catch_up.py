"""Relay catch-up: the relay is started on a backlog and timed until a checkpoint covers it."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from bench.common import (
    AGGREGATE_TYPE,
    Row,
    committed_messages,
    consumer,
    create_topic,
    in_kafka,
    log,
    rate,
    wait_for,
    warm_up_transactions,
)
from bench.relay_under_test import lease_token_data, relay_settings, running_relay
from bench.sampling import Sampler, Usage, self_peak_rss_mb, stack_roles
from bench.scenarios.backlog import Backlog
from relay.config import Settings
from relay.dev.stack import LocalStack


@dataclass
class _Drained:
    """What a catch-up measured: its time, the process's usage, the messages in Kafka."""

    seconds: float
    usage: Usage
    at_checkpoint: int
    final: int


def relay_catch_up(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, run_id: str,
                   label: str = "relay catch-up (to checkpoint)", delivery: str = "at-least-once",
                   env: dict[str, str] | None = None, native: bool = True) -> Row:
    """Start the relay on the backlog; time until a checkpoint covers the last backlog event.

    Done-condition: the lease document's `resumeToken._data` >= the `_data` of the last
    backlog event's own resume token. Resume tokens' `_data` is the hex of a KeyString
    whose order is the stream's order (cluster time first; at an equal cluster time a
    high-water-mark token sorts before the event), so a stored token strictly before the
    last event's token cannot cover it, and one at or past it covers every backlog event.
    The end time is that checkpoint's `checkpointAt` (server clock, ms, same machine), so the
    polling does not inflate the time. The start is just before the relay's thread starts,
    so the figure includes the relay's start-up (connection checks, lease, stream open).

    The relay promises to store a token only after Kafka acknowledged every event before
    it, so at that moment the topic must already hold all N messages (acks=all: the high
    watermark has moved before the ack). The benchmark checks this instead of trusting it:
    if fewer are there, the row says so and the time runs until the last message is in Kafka.

    `delivery="exactly-once"` runs the relay with RELAY_DELIVERY=exactly-once (Kafka transactions
    spanning reads, bench.scenarios.exactly_once); the messages are then counted as a read_committed
    consumer reads them (the watermarks also count commit markers), after the sampled interval.
    """
    exactly_once = delivery == "exactly-once"
    name = f"catchup-eos-{backlog.variant.key}" if exactly_once else f"catchup-{backlog.variant.key}"
    topic_template = f"bench.{run_id}.{name}.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    create_topic(stack.kafka.bootstrap_servers, topic)
    start_at = dt.datetime.fromtimestamp(backlog.before.time, dt.UTC).isoformat()
    settings = relay_settings(stack, backlog.database, topic_template, start_at, env)
    if exactly_once:
        # A lease document of its own: in the at-least-once run's, the checkpoint already covers
        # the backlog (and the relay would resume after it, as a switch of modes does).
        settings = settings.replace(delivery=delivery, offsets_topic=f"bench.{run_id}.offsets-{backlog.variant.key}",
                                    lease_collection=f"{settings.lease_collection}_exactly_once")
        warm_up_transactions(stack.kafka.bootstrap_servers)
    drained = _drain(stack, client, backlog, settings, topic, label, native)
    return _row(label, backlog, drained, topic, exactly_once)


def _drain(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, settings: Settings, topic: str,
           label: str, native: bool) -> _Drained:
    """Run the relay until a checkpoint covers the backlog (see `relay_catch_up`)."""
    exactly_once = settings.delivery == "exactly-once"

    def count(c: Any) -> int:
        return committed_messages(stack.kafka.bootstrap_servers, topic) if exactly_once else in_kafka(c, topic)

    leases = client[backlog.database][settings.lease_collection]

    def covered() -> dt.datetime | None:
        data, at = lease_token_data(leases, settings.namespace)
        return at if data is not None and data >= backlog.last_token_data else None

    with consumer(stack.kafka.bootstrap_servers) as c:
        with running_relay(settings, native) as runner, Sampler(stack_roles(stack)) as sampler:
            started_wall = time.time()
            runner.start()
            ended = wait_for(f"{label} ({backlog.variant.key})", covered, max(120.0, backlog.events / 500),
                             runner.check_alive).timestamp()
            usage = sampler.stop()
            at_checkpoint = count(c)
            if at_checkpoint < backlog.events:
                log.error("catch-up: the checkpoint covered the backlog while only %d of %d events "
                          "were in Kafka", at_checkpoint, backlog.events)
                wait_for("catch-up events in Kafka", lambda: count(c) >= backlog.events, 120, runner.check_alive)
                ended = max(ended, time.time())
        final = count(c)
    return _Drained(ended - started_wall, usage, at_checkpoint, final)


def _row(label: str, backlog: Backlog, d: _Drained, topic: str, exactly_once: bool) -> Row:
    note = "incl. relay start-up" + ("; Kafka transactions spanning reads" if exactly_once else "")
    if d.at_checkpoint < backlog.events:
        note += f"; CHECKPOINT AHEAD OF KAFKA ({d.at_checkpoint} in topic)"
    if d.final != backlog.events:
        note += f"; {d.final} messages in topic"
    usage, n = d.usage, backlog.events
    return Row(label, n, d.seconds, rate(n, d.seconds), variant=backlog.variant.key, kind="relay",
               cpu_us_per_event=usage.cpu_us_per_event("bench", n),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", n),
               peak_rss_mb=usage.peak_rss_mb.get("bench", float("nan")),
               other_cores=usage.other_cores, iowait_cores=usage.iowait_cores, note=note,
               extra={"topic": topic, "in_kafka_at_checkpoint": d.at_checkpoint, "in_kafka_final": d.final,
                      "rss_before_mb": usage.rss_start_mb.get("bench"), "rss_after_mb": usage.rss_end_mb.get("bench"),
                      "ru_maxrss_mb": self_peak_rss_mb(), "cpu_s": usage.cpu_s,
                      "kafka_cpu_us_per_event": usage.cpu_us_per_event("kafka", n)})

"""Partitioned outbox (RELAY_PARTITIONS, docs/partitions.md): catch-up with several relay
processes, and what each change stream costs mongod.

`group_catch_up`: `outbox-relay run` processes (1, 2, 4, ...) started together on the same
backlog with RELAY_PARTITIONS=N, each with its own lease collection and topic, timed from their
launch until every backlog event is in Kafka (the watermarks; no duplicates are expected in a
clean run, and the note says if there were). Beside the elapsed time, `drain` is the time from
the first message in Kafka to the last (without the processes' start-up), and the CPU of every
relay process (summed; and the busiest one), mongod and the broker. The one-process N=1 row of
the same run is the comparison. The relays poll the lease every 0.5 s (RELAY_STANDBY_POLL_S), so
a group settles its shares within about a second of starting.

`stream_cost`: K change streams on the backlog, the pipelines of K partitions (K=1: the
unpartitioned pipeline), read from the backlog's start in K threads of this process (raw BSON,
batches of 1000, nothing done with the changes) until each has its partition's events. Every
stream scans the whole oplog and evaluates its `$match` on every insert; mongod's CPU per
backlog event, and per stream, is what N streams cost the server.
"""

from __future__ import annotations

import datetime as dt
import math
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, Row, consumer, create_topic, in_kafka, rate, wait_for
from bench.events import aggregate_id
from bench.relay_under_test import relay_settings
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from harness.relays import RelayProcess
from relay.core.partitions import Partition, partition_of
from relay.dev.stack import LocalStack
from relay.mongo.pipeline import pipeline

RAW = CodecOptions(document_class=RawBSONDocument)


def group_catch_up(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, run_id: str,
                   partitions: int, processes: int, tag: str | None = None) -> Row:
    """`processes` relay processes with RELAY_PARTITIONS=`partitions` drain the backlog (above);
    `tag` names the run's topic and lease collection (default: from the counts)."""
    tag = tag or f"n{partitions}x{processes}"
    topic_template = f"bench.{run_id}.group-{tag}.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    create_topic(stack.kafka.bootstrap_servers, topic)
    start_at = dt.datetime.fromtimestamp(backlog.before.time, dt.UTC).isoformat()
    base = relay_settings(stack, backlog.database, topic_template, start_at).replace(
        partitions=partitions, lease_collection=f"leases_{tag}", standby_poll_s=0.5)
    logs = Path(tempfile.mkdtemp(prefix=f"bench-{tag}-"))
    relays = [RelayProcess(base.replace(instance_id=f"bench-{tag}-{i}"), logs, f"relay-{i}")
              for i in range(processes)]

    def roles() -> dict[str, int | None]:
        return {f"relay-{i}": (r.proc.pid if r.proc is not None else None) for i, r in enumerate(relays)}

    label = f"{processes} relay process{'es' if processes > 1 else ''}, {partitions} partition{'s' if partitions > 1 else ''}"
    first: list[float] = []
    with consumer(stack.kafka.bootstrap_servers) as c, Sampler(stack_roles(stack, roles)) as sampler:
        started = time.time()
        try:
            for r in relays:
                r.start()

            def done() -> bool:
                count = in_kafka(c, topic)
                if count and not first:
                    first.append(time.time())
                return count >= backlog.events

            def alive() -> None:
                for r in relays:
                    if not r.alive:
                        raise RuntimeError(f"a relay process stopped: {r.log()[-2000:]}")

            wait_for(f"group catch-up ({tag})", done, max(180.0, backlog.events / 300), alive)
            ended = time.time()
            usage = sampler.stop()
        finally:
            for r in relays:
                r.stop()
        final = in_kafka(c, topic)
    return _group_row(label, backlog, ended - started, ended - first[0] if first else math.nan, usage, final,
                      partitions, processes, topic)


def _group_row(label: str, backlog: Backlog, seconds: float, drain: float, usage: Any, final: int, partitions: int,
               processes: int, topic: str) -> Row:
    per_process = [usage.cpu_us_per_event(f"relay-{i}", backlog.events) for i in range(processes)]
    note = f"drain {drain:.1f} s ({rate(backlog.events, drain):,.0f}/s); incl. start-up"
    if final != backlog.events:
        note += f"; {final - backlog.events} duplicates"
    return Row(label, backlog.events, seconds, rate(backlog.events, seconds), kind="partitions",
               cpu_us_per_event=sum(per_process),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", backlog.events),
               other_cores=usage.other_cores, iowait_cores=usage.iowait_cores, note=note,
               extra={"partitions": partitions, "processes": processes, "drain_s": drain,
                      "cpu_us_per_event_per_process": per_process,
                      "kafka_cpu_us_per_event": usage.cpu_us_per_event("kafka", backlog.events),
                      "peak_rss_mb_per_process": [usage.peak_rss_mb.get(f"relay-{i}") for i in range(processes)],
                      "rss_last_mb_per_process": [usage.rss_end_mb.get(f"relay-{i}") for i in range(processes)],
                      "topic": topic})


def stream_cost(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, streams: int) -> Row:
    """`streams` partition change streams read the backlog at once (above)."""
    coll = client[backlog.database][backlog.collection].with_options(codec_options=RAW)
    if streams == 1:
        stages = [pipeline(Partition(0, 1))]
        expected = [backlog.events]
    else:
        stages = [pipeline(Partition(k, streams)) for k in range(streams)]
        per_key = Counter(aggregate_id(seq) for seq in range(backlog.events))
        counts = Counter()
        for key, n in per_key.items():
            counts[partition_of(key, streams)] += n
        expected = [counts[k] for k in range(streams)]
    got = [0] * streams
    errors: list[BaseException] = []

    def read(k: int) -> None:
        try:
            with coll.watch(stages[k], start_at_operation_time=backlog.before, batch_size=1000,
                            max_await_time_ms=500) as stream:
                while got[k] < expected[k]:
                    if stream.try_next() is not None:
                        got[k] += 1
        except BaseException as exc:  # noqa: BLE001 - reported in the row
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(k,), daemon=True) for k in range(streams)]
    with Sampler(stack_roles(stack)) as sampler:
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        seconds = time.perf_counter() - started
        usage = sampler.stop()
    mongod = usage.cpu_us_per_event("mongod", backlog.events)
    return Row(f"{streams} change stream{'s' if streams > 1 else ''}", backlog.events, seconds,
               rate(backlog.events, seconds), kind="streams", mongod_cpu_us_per_event=mongod,
               cpu_us_per_event=usage.cpu_us_per_event("bench", backlog.events),
               other_cores=usage.other_cores, iowait_cores=usage.iowait_cores,
               note=f"mongod {mongod / streams:.1f} µs per event per stream",
               error=repr(errors[0]) if errors else (None if got == expected else f"read {got} of {expected}"),
               extra={"streams": streams, "expected": expected, "read": got})

"""The `materialize` benchmark: events per second through the Spark pipeline, local[2].

Run: `.venv/bin/python -m bench.spark_materialize [--events N] [--aggregates A]
[--duplicates F] [--batch B] [--json PATH]` (a few minutes on two cores with the defaults).

Set-up (not measured): a fresh local stack (`relay.dev.stack.LocalStack` in a temporary folder:
one mongod replica-set member, one Kafka broker, topics of 3 partitions), stopped and deleted at
the end. N outbox events over A aggregates are produced to one topic as the relay writes them:
values from the relay's own encoder (`SchemaFolder.encode`, generic envelope, payload of about
100 bytes of Extended JSON), key = aggregate id, the relay's headers, positions increasing in
production order. Then a fraction F of them is produced again (the duplicates a relay replay
leaves), so the topic holds N * (1 + F) messages.

Spark: one session, `local[2]`, `spark.sql.shuffle.partitions=2`, RocksDB state store, as the
tests use it, warmed up first by running scenarios 1-3 on a separate topic of 2,000 events (not
reported). Scenarios, in this order, each on all messages:
1. `baseline: kafka read`: batch read of the topic, count (the cost of reading alone);
2. `baseline: read + decode`: the same plus `decode_events` (from_avro), forced by aggregating
   decoded columns;
3. `materialize, one micro-batch`: `materialize(once=True)` into a fresh output and MongoDB
   collection; `events` (decode, de-duplication, partitioned Parquet) and `state` (aggregation,
   Parquet snapshot, MongoDB conditional upserts) timed separately from their start to the end of
   their last micro-batch (in `once` mode the state query starts when the event query is done);
4. `materialize, micro-batches of B messages` (`maxOffsetsPerTrigger`), as a streaming job
   catching up.
Throughput is messages per second (duplicates included: they cost as much to read); events per
second counts distinct events. The load average is printed: the machine may be shared.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bson import ObjectId, json_util
from bson.json_util import RELAXED_JSON_OPTIONS
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.core.message import HEADER_FENCING
from relay.dev.stack import LocalStack

log = logging.getLogger("bench.spark")
TOPIC = "bench.spark.order"
WARM_UP_TOPIC = "bench.spark.warmup"
WARM_UP_EVENTS = 2_000
PARTITIONS = 3


@dataclass
class Result:
    scenario: str
    messages: int
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


# ---- set-up -----------------------------------------------------------------------------------

Headers = list[tuple[str, str | bytes | None]]


def _messages(events: int, aggregates: int, seed: int) -> list[tuple[bytes, bytes, Headers]]:
    """(key, value, headers) for `events` relay messages in commit order."""
    registry = SchemaFolder.bundled()
    rng = random.Random(seed)
    start = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    out = []
    for i in range(events):
        aggregate = f"order-{rng.randrange(aggregates)}"
        occurred = start + dt.timedelta(milliseconds=37 * i)
        event_id = str(ObjectId())
        payload = {"orderId": aggregate, "amount": round(rng.uniform(5, 500), 2), "step": i % 3 + 1,
                   "note": "x" * rng.randint(20, 60)}
        value = registry.encode(ENVELOPE, {
            "id": event_id, "aggregateType": "order", "aggregateId": aggregate, "eventType": "OrderChanged",
            "occurredAt": occurred, "payload": json_util.dumps(payload, json_options=RELAXED_JSON_OPTIONS),
            "source": {"database": "bench", "collection": "outbox", "clusterTime": i,
                       "position": f"82{i:016X}"}})
        headers: Headers = [("ce_id", event_id.encode()), ("ce_type", b"OrderChanged"), ("ce_specversion", b"1.0"),
                   ("ce_subject", aggregate.encode()), ("content-type", b"application/avro"),
                   (HEADER_FENCING, b"1")]
        out.append((aggregate.encode(), value, headers))
    return out


def produce_topic(bootstrap: str, events: int, aggregates: int, duplicates: float, seed: int = 7,
                  topic: str = TOPIC) -> int:
    """Fill `topic`; returns the number of messages (events plus re-published copies)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=60)
    messages = _messages(events, aggregates, seed)
    copies = random.Random(seed).sample(messages, int(events * duplicates))
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 20, "compression.type": "lz4"})
    for key, value, headers in [*messages, *copies]:
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("messages left undelivered")
    return len(messages) + len(copies)


# ---- scenarios ---------------------------------------------------------------------------------

def _timed(scenario: str, messages: int, action: Any) -> Result:
    started = time.monotonic()
    detail = action() or {}
    return Result(scenario, messages, time.monotonic() - started, detail)


def baselines(spark: Any, bootstrap: str, messages: int, topic: str = TOPIC) -> list[Result]:
    from pyspark.sql import functions as F

    from relay.spark.decode import decode_events, kafka_options
    from relay.spark.schemas import writer_schemas

    def raw() -> Any:
        return (spark.read.format("kafka").options(**kafka_options(bootstrap, (topic,), None))
                .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())

    def read() -> dict[str, Any]:
        return {"count": raw().count()}

    def decode() -> dict[str, Any]:
        row = decode_events(raw(), writer_schemas()).agg(F.count("id").alias("n"),
                                                         F.max("source.position").alias("p")).first()
        return {"count": row["n"] if row is not None else 0}

    return [_timed("baseline: kafka read", messages, read),
            _timed("baseline: read + decode", messages, decode)]


def materialize_run(spark: Any, stack: LocalStack, workdir: Path, messages: int, batch: int | None,
                    name: str, topic: str = TOPIC) -> list[Result]:
    from relay.spark.materialize import MaterializeConfig, MongoView, materialize

    output = workdir / name
    cfg = MaterializeConfig(
        bootstrap_servers=stack.kafka.bootstrap_servers, topics=(topic,), topic_pattern=None,
        output=str(output), checkpoint=str(output / "_checkpoints"),
        view=MongoView(stack.mongo.uri, "bench", f"state_{name}"), once=True, max_offsets_per_trigger=batch)
    started = time.monotonic()
    runs = materialize(spark, cfg)
    total = time.monotonic() - started
    label = "one micro-batch" if batch is None else f"micro-batches of {batch}"
    results = [Result(f"materialize, {label}: {run.name}", messages, run.seconds,
                      {"batches": run.batches, "rows": run.rows}) for run in runs]
    results.append(Result(f"materialize, {label}: total", messages, total))
    return results


# ---- report ------------------------------------------------------------------------------------

def report_lines(results: list[Result], events: int, baseline: float) -> list[str]:
    lines = [f"{'scenario':<52} {'messages':>9} {'seconds':>8} {'msgs/s':>9} {'events/s':>9} {'vs read':>8}"]
    for r in results:
        ratio = r.per_second / baseline if baseline else 0.0
        lines.append(f"{r.scenario:<52} {r.messages:>9} {r.seconds:>8.2f} {r.per_second:>9.0f} "
                     f"{events / r.seconds if r.seconds else 0:>9.0f} {ratio:>7.2f}x"
                     + (f"  {r.detail}" if r.detail.get("batches") else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spark_materialize", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000, help="distinct events (default 100000)")
    p.add_argument("--aggregates", type=int, default=5_000, help="aggregate ids (default 5000)")
    p.add_argument("--duplicates", type=float, default=0.1, help="fraction re-published (default 0.1)")
    p.add_argument("--batch", type=int, default=25_000, help="messages per micro-batch in scenario 4")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from relay.spark.session import spark_session

    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="outbox-relay-bench-spark-"))
    stack = LocalStack(workdir / "stack", partitions=PARTITIONS)
    print(f"bench: starting a local stack in {workdir} ...", file=sys.stderr, flush=True)
    stack.start()
    try:
        started = time.monotonic()
        messages = produce_topic(stack.kafka.bootstrap_servers, args.events, args.aggregates, args.duplicates)
        warm_up = produce_topic(stack.kafka.bootstrap_servers, WARM_UP_EVENTS, 200, 0.1, topic=WARM_UP_TOPIC)
        print(f"bench: {messages} messages produced in {time.monotonic() - started:.1f}s; starting Spark ...",
              file=sys.stderr, flush=True)
        spark = spark_session("bench spark materialize", master="local[2]", shuffle_partitions=2,
                              conf={"spark.ui.enabled": "false"})
        try:
            # Warm-up (not reported): the same code paths once on a small topic (JIT, Kafka
            # consumers, state store, Python workers, MongoDB clients).
            baselines(spark, stack.kafka.bootstrap_servers, warm_up, WARM_UP_TOPIC)
            materialize_run(spark, stack, workdir, warm_up, None, "warmup", WARM_UP_TOPIC)
            results = baselines(spark, stack.kafka.bootstrap_servers, messages)
            results += materialize_run(spark, stack, workdir, messages, None, "single")
            results += materialize_run(spark, stack, workdir, messages, args.batch, "batched")
        finally:
            spark.stop()
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    header = (f"spark materialize benchmark: {messages} messages = {args.events} events + "
              f"{messages - args.events} duplicates over {args.aggregates} aggregates; local[2], "
              f"shuffle partitions 2; {os.cpu_count()} cores, load average {load_before[0]:.1f} before, "
              f"{load_after[0]:.1f} after")
    print(header)
    print("\n".join(report_lines(results, args.events, results[0].per_second)))
    document = {"header": header, "results": [asdict(r) | {"perSecond": r.per_second} for r in results]}
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

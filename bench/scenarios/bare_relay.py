"""Baseline: the bare relay, the least work that still does the relay's job on this backlog.

One server batch at a time: `aggregate` with `$changeStream` (then `getMore`), decoded as
RawBSONDocument; each insert's `fullDocument` bytes produced unchanged, keyed by its
`aggregateId`, through an idempotent producer with the relay's producer configuration
(`Settings.parts().kafka.producer_config()`); `flush()` waits for every delivery report of the batch before the
next `getMore`, like the relay's one-batch-at-a-time default. No envelope, no headers, no
checkpoint, no lease. The gap between it and the relay is what the relay's own code costs;
the gap between it and the bare change stream is what Kafka costs on this machine.

It runs as a process of its own (`python -m bench.scenarios.bare_relay <json>`, `main`), timed like
every contestant from its topic (bench.scenarios.drain); its CPU and RSS are that process's.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from confluent_kafka import Producer
from pymongo import MongoClient

from bench.common import Row, consumer, create_topic, in_kafka, wait_for
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from bench.scenarios.drain import BenchChild, CpuAtFirst, rate_of, topic_span
from relay.config import Settings
from relay.dev.stack import LocalStack

RAW = CodecOptions(document_class=RawBSONDocument)
LABEL = "baseline: bare relay"


def bare_relay(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, settings: Settings,
               topic: str) -> Row:
    """Drain the backlog in a child process as described above; its row (`client` unused: the
    child opens its own)."""
    create_topic(stack.kafka.bootstrap_servers, topic)
    batch_size = settings.batch_max_events
    arguments = {"uri": stack.mongo.uri, "database": backlog.database, "collection": backlog.collection,
                 "before": [backlog.before.time, backlog.before.inc], "events": backlog.events, "topic": topic,
                 "batch_size": batch_size, "max_await_ms": settings.max_await_ms,
                 "producer": settings.parts().kafka.producer_config()}
    child = BenchChild("bench.scenarios.bare_relay", arguments)
    pid = lambda: child.proc.pid if child.proc else None  # noqa: E731
    with consumer(stack.kafka.bootstrap_servers) as c:
        at_first = CpuAtFirst(pid, lambda: in_kafka(c, topic))

        def ended() -> bool:
            at_first.poll()
            return child.returncode is not None

        try:
            with Sampler(stack_roles(stack, lambda: {"child": pid()})) as sampler:
                launched = time.time()
                child.start()
                wait_for(LABEL, ended, max(120.0, backlog.events / 300), child.check_alive)
                usage = sampler.stop()
            count = int(child.reported()["count"])
        finally:
            child.stop()
    span = topic_span(stack.kafka.bootstrap_servers, topic, launched)
    return Row(LABEL, count, span.drain_s, rate_of(count, span), variant=backlog.variant.key,
               cpu_us_per_event=at_first.per_event_us(usage.cpu_s.get("child", float("nan")), count),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count),
               peak_rss_mb=usage.peak_rss_mb.get("child", float("nan")), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores,
               note=f"raw fullDocument bytes, key aggregateId, relay's producer config, reports awaited per "
                    f"batch of {batch_size}; first to last message, start-up {span.start_up_s:.1f} s apart",
               extra={"start_up_s": span.start_up_s, "start_up_cpu_s": at_first.cpu_s, "topic": topic,
                      "process": "child"})


def drain(a: dict[str, Any]) -> int:
    """The bare relay's loop (above) on the arguments `bare_relay` passes; the events produced."""
    failed: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    topic, collection, batch_size = a["topic"], a["collection"], a["batch_size"]
    pipeline = [{"$changeStream": {"startAtOperationTime": Timestamp(*a["before"])}},
                {"$match": {"operationType": "insert"}}]
    count = 0
    client: MongoClient[Any]
    with MongoClient(a["uri"]) as client, client.start_session() as session:
        db = client[a["database"]]
        producer = Producer(a["producer"])
        produce = producer.produce
        reply = db.command("aggregate", collection, pipeline=pipeline, cursor={"batchSize": batch_size},
                           session=session, codec_options=RAW)
        cursor_id, batch = reply["cursor"]["id"], reply["cursor"]["firstBatch"]
        try:
            while True:
                for change in batch:
                    document = change["fullDocument"]
                    produce(topic, bytes(document.raw), document["aggregateId"].encode(), on_delivery=on_delivery)
                while producer.flush(10.0) > 0:
                    pass
                if failed:
                    raise RuntimeError(f"bare relay: delivery failed: {failed[0]}")
                count += len(batch)
                if count >= a["events"]:
                    return count
                reply = db.command("getMore", cursor_id, collection=collection, batchSize=batch_size,
                                   maxTimeMS=a["max_await_ms"], session=session, codec_options=RAW)
                batch = reply["cursor"]["nextBatch"]
        finally:
            db.command("killCursors", collection, cursors=[cursor_id], session=session)


if __name__ == "__main__":
    print(json.dumps({"count": drain(json.loads(sys.argv[1]))}), flush=True)

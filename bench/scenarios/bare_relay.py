"""Baseline: the bare relay, the least work that still does the relay's job on this backlog.

One server batch at a time: `aggregate` with `$changeStream` (then `getMore`), decoded as
RawBSONDocument; each insert's `fullDocument` bytes produced unchanged, keyed by its
`aggregateId`, through an idempotent producer with the relay's producer configuration
(`Settings.parts().kafka.producer_config()`); `flush()` waits for every delivery report of the batch before the
next `getMore`, like the relay's one-batch-at-a-time default. No envelope, no headers, no
checkpoint, no lease. The gap between it and the relay is what the relay's own code costs;
the gap between it and the bare change stream is what Kafka costs on this machine.
"""

from __future__ import annotations

import time
from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from confluent_kafka import Producer
from pymongo import MongoClient

from bench.common import Row, create_topic, rate
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from relay.config import Settings
from relay.dev.stack import LocalStack

RAW = CodecOptions(document_class=RawBSONDocument)


def bare_relay(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, settings: Settings,
               topic: str) -> Row:
    """Drain the backlog as described above; time from the first command to the last batch's reports."""
    create_topic(stack.kafka.bootstrap_servers, topic)
    batch_size = settings.batch_max_events
    db = client[backlog.database]
    pipeline = [{"$changeStream": {"startAtOperationTime": backlog.before}},
                {"$match": {"operationType": "insert"}}]
    failed: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    count = 0
    with Sampler(stack_roles(stack)) as sampler, client.start_session() as session:
        started = time.perf_counter()
        producer = Producer(settings.parts().kafka.producer_config())
        produce = producer.produce
        reply = db.command("aggregate", backlog.collection, pipeline=pipeline, cursor={"batchSize": batch_size},
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
                if count >= backlog.events:
                    break
                reply = db.command("getMore", cursor_id, collection=backlog.collection, batchSize=batch_size,
                                   maxTimeMS=settings.max_await_ms, session=session, codec_options=RAW)
                batch = reply["cursor"]["nextBatch"]
            seconds = time.perf_counter() - started
        finally:
            db.command("killCursors", backlog.collection, cursors=[cursor_id], session=session)
    usage = sampler.stop()
    return Row("baseline: bare relay", count, seconds, rate(count, seconds), variant=backlog.variant.key,
               cpu_us_per_event=usage.cpu_us_per_event("bench", count),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count),
               peak_rss_mb=usage.peak_rss_mb.get("bench", float("nan")), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores,
               note=f"raw fullDocument bytes, key aggregateId, relay's producer config, "
                    f"reports awaited per batch of {batch_size}")

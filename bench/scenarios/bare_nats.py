"""Baseline: the bare relay to NATS JetStream, the least work that still does the relay's job there.

The change stream read as bench.scenarios.bare_relay reads it for Kafka: one server batch at a
time, `aggregate` with `$changeStream` (then `getMore`), decoded as RawBSONDocument, the relay's
batch size and await time. Each insert's `fullDocument` bytes are published unchanged to the
subject, with one header, `Nats-Msg-Id` = the event id (the document's `_id`: the stream drops a
copy within its duplicate window, as for the relay's messages), through nats-py's `publish_async`;
every acknowledgement (PubAck) of the batch is awaited before the next `getMore`, like the
relay's one-batch-at-a-time default. One asyncio event loop on one thread, the getMore blocking
it (nothing else is in flight then). No envelope, no other header, no checkpoint, no lease. The
gap between it and the relay to NATS is what the relay's own code costs on NATS.

It runs as a process of its own (`python -m bench.scenarios.bare_nats <json>`), into a stream of
its own created before it starts, timed like every contestant from its first stored message to
its last (bench.jetstream.StreamOutput); its CPU and RSS are that process's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import nats
from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, Row, wait_for
from bench.jetstream import MSG_ID, StreamOutput, stream_name
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from bench.scenarios.drain import BenchChild, CpuAtFirst, rate_of
from bench.stack import nats_url
from relay.config import Settings
from relay.dev.stack import LocalStack

RAW = CodecOptions(document_class=RawBSONDocument)
LABEL = "baseline: bare relay to NATS"
ACK_TIMEOUT_S = 30.0


def bare_nats_relay(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, settings: Settings,
                    run_id: str) -> Row:
    """Drain the backlog in a child process as described above; its row (`client` unused: the
    child opens its own)."""
    name = f"bare-nats-{backlog.variant.key}"
    subject = f"bench.{run_id}.{name}.{AGGREGATE_TYPE}"
    output = StreamOutput(nats_url(stack), stream_name("bench", run_id, name), [f"bench.{run_id}.{name}.>"])
    output.prepare()
    batch_size = settings.batch_max_events
    arguments = {"uri": stack.mongo.uri, "database": backlog.database, "collection": backlog.collection,
                 "before": [backlog.before.time, backlog.before.inc], "events": backlog.events, "url": output.url,
                 "subject": subject, "batch_size": batch_size, "max_await_ms": settings.max_await_ms}
    child = BenchChild("bench.scenarios.bare_nats", arguments)
    pid = lambda: child.proc.pid if child.proc else None  # noqa: E731
    try:
        with output.opened():
            at_first = CpuAtFirst(pid, output.delivered)

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
            stored = output.count()
            span = output.span(launched)
    finally:
        output.discard()
    note = (f"raw fullDocument bytes, Nats-Msg-Id only, publish_async, PubAcks awaited per batch of {batch_size}; "
            f"first to last stored message, start-up {span.start_up_s:.1f} s apart")
    if stored != count:
        note += f"; {stored} messages in stream"
    return Row(LABEL, count, span.drain_s, rate_of(count, span), variant=backlog.variant.key,
               cpu_us_per_event=at_first.per_event_us(usage.cpu_s.get("child", float("nan")), count),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count),
               peak_rss_mb=usage.peak_rss_mb.get("child", float("nan")), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores, note=note,
               extra={"start_up_s": span.start_up_s, "start_up_cpu_s": at_first.cpu_s, "stream": output.stream,
                      "process": "child", "nats_cpu_us_per_event": usage.cpu_us_per_event("nats", count),
                      "broker": "nats", "in_stream_final": stored})


async def drain(a: dict[str, Any]) -> int:
    """The bare relay's loop (above) on the arguments `bare_nats_relay` passes; the events published."""
    subject, collection, batch_size = a["subject"], a["collection"], a["batch_size"]
    pipeline = [{"$changeStream": {"startAtOperationTime": Timestamp(*a["before"])}},
                {"$match": {"operationType": "insert"}}]
    count = 0
    connection = await nats.connect(a["url"])
    js = connection.jetstream()
    publish = js.publish_async
    client: MongoClient[Any]
    try:
        with MongoClient(a["uri"]) as client, client.start_session() as session:
            db = client[a["database"]]
            reply = db.command("aggregate", collection, pipeline=pipeline, cursor={"batchSize": batch_size},
                               session=session, codec_options=RAW)
            cursor_id, batch = reply["cursor"]["id"], reply["cursor"]["firstBatch"]
            try:
                while True:
                    acks = []
                    for change in batch:
                        document = change["fullDocument"]
                        acks.append(await publish(subject, bytes(document.raw),
                                                  headers={MSG_ID: str(document["_id"])}))
                    if acks:
                        await asyncio.wait_for(asyncio.gather(*acks), ACK_TIMEOUT_S)  # raises at a failed PubAck
                    count += len(batch)
                    if count >= a["events"]:
                        return count
                    reply = db.command("getMore", cursor_id, collection=collection, batchSize=batch_size,
                                       maxTimeMS=a["max_await_ms"], session=session, codec_options=RAW)
                    batch = reply["cursor"]["nextBatch"]
            finally:
                db.command("killCursors", collection, cursors=[cursor_id], session=session)
    finally:
        await connection.close()


if __name__ == "__main__":
    print(json.dumps({"count": asyncio.run(drain(json.loads(sys.argv[1])))}), flush=True)

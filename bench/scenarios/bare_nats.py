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
from contextlib import closing
from typing import Any

import nats
from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, Row
from bench.jetstream import MSG_ID, StreamOutput, stream_name
from bench.scenarios.backlog import Backlog
from bench.scenarios.bare import change_arguments, raw_change_batches, run_bare
from bench.stack import nats_url
from relay.config import Settings
from relay.dev.stack import LocalStack

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
    arguments = {**change_arguments(stack, backlog, batch_size, settings.max_await_ms), "url": output.url,
                 "subject": subject}
    run = run_bare(stack, backlog, output, "bench.scenarios.bare_nats", arguments, LABEL)
    note = (f"raw fullDocument bytes, Nats-Msg-Id only, publish_async, PubAcks awaited per batch of {batch_size}; "
            f"first to last stored message, start-up {run.span.start_up_s:.1f} s apart")
    if run.stored != run.count:
        note += f"; {run.stored} messages in stream"
    return run.row(LABEL, backlog, note, {"stream": output.stream, "broker": "nats", "in_stream_final": run.stored,
                                          "nats_cpu_us_per_event": run.usage.cpu_us_per_event("nats", run.count)})


async def drain(a: dict[str, Any]) -> int:
    """The bare relay's loop (above) on the arguments `bare_nats_relay` passes; the events published."""
    subject, count = a["subject"], 0
    connection = await nats.connect(a["url"])
    publish = connection.jetstream().publish_async
    try:
        with closing(raw_change_batches(a)) as batches:
            for batch in batches:
                acks = []
                for change in batch:
                    document = change["fullDocument"]
                    acks.append(await publish(subject, bytes(document.raw), headers={MSG_ID: str(document["_id"])}))
                if acks:
                    await asyncio.wait_for(asyncio.gather(*acks), ACK_TIMEOUT_S)  # raises at a failed PubAck
                count += len(batch)
                if count >= a["events"]:
                    break
        return count
    finally:
        await connection.close()


if __name__ == "__main__":
    print(json.dumps({"count": asyncio.run(drain(json.loads(sys.argv[1])))}), flush=True)

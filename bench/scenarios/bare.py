"""What the bare relays to NATS and to RabbitMQ share (bench.scenarios.bare_nats, bare_rabbitmq):
the change stream read raw as bench.scenarios.bare_relay reads it for Kafka (`raw_change_batches`),
and the run of the child process on an Output with its row (`run_bare`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from bench.common import Row, wait_for
from bench.sampling import Sampler, Usage, stack_roles
from bench.scenarios.backlog import Backlog
from bench.scenarios.drain import BenchChild, CpuAtFirst, Output, Span, rate_of

RAW = CodecOptions(document_class=RawBSONDocument)


def change_arguments(stack: Any, backlog: Backlog, batch_size: int, max_await_ms: int) -> dict[str, Any]:
    """What `raw_change_batches` reads, as a child's arguments: the backlog's change stream."""
    return {"uri": stack.mongo.uri, "database": backlog.database, "collection": backlog.collection,
            "before": [backlog.before.time, backlog.before.inc], "events": backlog.events,
            "batch_size": batch_size, "max_await_ms": max_await_ms}


def raw_change_batches(a: dict[str, Any]) -> Iterator[list[Any]]:
    """The inserts' change events from `a["before"]`, one server batch at a time: `aggregate` with
    `$changeStream` (then `getMore`), decoded as RawBSONDocument, the relay's batch size and await
    time; the cursor is killed when the caller stops (close the generator). Each call blocks."""
    collection, batch_size = a["collection"], a["batch_size"]
    pipeline = [{"$changeStream": {"startAtOperationTime": Timestamp(*a["before"])}},
                {"$match": {"operationType": "insert"}}]
    client: MongoClient[Any]
    with MongoClient(a["uri"]) as client, client.start_session() as session:
        db = client[a["database"]]
        reply = db.command("aggregate", collection, pipeline=pipeline, cursor={"batchSize": batch_size},
                           session=session, codec_options=RAW)
        cursor_id, batch = reply["cursor"]["id"], reply["cursor"]["firstBatch"]
        try:
            while True:
                yield batch
                reply = db.command("getMore", cursor_id, collection=collection, batchSize=batch_size,
                                   maxTimeMS=a["max_await_ms"], session=session, codec_options=RAW)
                batch = reply["cursor"]["nextBatch"]
        finally:
            db.command("killCursors", collection, cursors=[cursor_id], session=session)


@dataclass
class BareRun:
    """One bare relay's run: the events it reported, what its output held after, the span, the
    servers' and its usage, its CPU at its first event."""

    count: int
    stored: int
    span: Span
    usage: Usage
    at_first: CpuAtFirst

    def row(self, label: str, backlog: Backlog, note: str, extra: dict[str, Any]) -> Row:
        """Its row: rate, the child's CPU per event from its first event, mongod's, its peak RSS."""
        count, usage = self.count, self.usage
        return Row(label, count, self.span.drain_s, rate_of(count, self.span), variant=backlog.variant.key,
                   cpu_us_per_event=self.at_first.per_event_us(usage.cpu_s.get("child", math.nan), count),
                   mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count),
                   peak_rss_mb=usage.peak_rss_mb.get("child", math.nan), other_cores=usage.other_cores,
                   iowait_cores=usage.iowait_cores, note=note,
                   extra={"start_up_s": self.span.start_up_s, "start_up_cpu_s": self.at_first.cpu_s,
                          "process": "child", **extra})


def run_bare(stack: Any, backlog: Backlog, output: Output, module: str, arguments: dict[str, Any],
             label: str) -> BareRun:
    """`python -m <module> <arguments>` on the prepared `output` until it ends, sampled (role
    "child"), timed by the output; the output discarded after."""
    child = BenchChild(module, arguments)
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
                    wait_for(label, ended, max(120.0, backlog.events / 300), child.check_alive)
                    usage = sampler.stop()
                count = int(child.reported()["count"])
            finally:
                child.stop()
            return BareRun(count, output.count(), output.span(launched), usage, at_first)
    finally:
        output.discard()

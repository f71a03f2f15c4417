"""Baseline: a bare pymongo change stream reading the backlog's inserts, doing nothing with them.

It runs as a process of its own (`python -m bench.scenarios.change_stream <json>`), which reports the
wall times (`time.time()`) of its first and last change: the same clock and rule as the topics'
append times of the contestants that write to Kafka (bench.scenarios.drain); and its CPU between
them (`time.process_time()`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from bench.common import Row, wait_for
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from bench.scenarios.drain import BenchChild, Span, rate_of
from relay.dev.stack import LocalStack

LABEL = "baseline: bare change stream"


def bare_change_stream(stack: LocalStack, client: MongoClient[Any], backlog: Backlog) -> Row:
    """`watch()` from before the backlog, RawBSONDocument (no decode), batch 1000, in a child
    process, until N inserts were read (`client` unused: the child opens its own)."""
    arguments = {"uri": stack.mongo.uri, "database": backlog.database, "collection": backlog.collection,
                 "before": [backlog.before.time, backlog.before.inc], "events": backlog.events}
    child = BenchChild("bench.scenarios.change_stream", arguments)
    try:
        with Sampler(stack_roles(stack, lambda: {"child": child.proc.pid if child.proc else None})) as sampler:
            launched = time.time()
            child.start()
            wait_for(LABEL, lambda: child.returncode is not None, max(120.0, backlog.events / 300), child.check_alive)
            usage = sampler.stop()
        report = child.reported()
    finally:
        child.stop()
    count, span = int(report["count"]), Span(launched, report["first"], report["last"])
    return Row(LABEL, count, span.drain_s, rate_of(count, span), variant=backlog.variant.key,
               cpu_us_per_event=(report["cpu_last"] - report["cpu_first"]) / count * 1e6 if count else float("nan"),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count),
               peak_rss_mb=usage.peak_rss_mb.get("child", float("nan")), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores,
               note=f"watch(), RawBSONDocument, batch 1000; first to last change, start-up {span.start_up_s:.1f} s apart",
               extra={"start_up_s": span.start_up_s, "start_up_cpu_s": report["cpu_first"], "process": "child"})


def read(a: dict[str, Any]) -> dict[str, Any]:
    """Read `events` inserts (arguments as `bare_change_stream` passes them); the wall times of the first and last."""
    first = last = cpu_first = cpu_last = float("nan")
    count = 0
    client: MongoClient[Any]
    with MongoClient(a["uri"]) as client:
        coll = client[a["database"]][a["collection"]].with_options(
            codec_options=CodecOptions(document_class=RawBSONDocument))
        with coll.watch([{"$match": {"operationType": "insert"}}], start_at_operation_time=Timestamp(*a["before"]),
                        batch_size=1000) as stream:
            for _ in stream:
                count += 1
                if count == 1:
                    first, cpu_first = time.time(), time.process_time()
                if count == a["events"]:
                    last, cpu_last = time.time(), time.process_time()
                    break
    return {"count": count, "first": first, "last": last, "cpu_first": cpu_first, "cpu_last": cpu_last}


if __name__ == "__main__":
    print(json.dumps(read(json.loads(sys.argv[1]))), flush=True)

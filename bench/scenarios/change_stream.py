"""Baseline: a bare pymongo change stream reading the backlog's inserts, doing nothing with them."""

from __future__ import annotations

import time
from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from bench.common import Row, rate
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from relay.dev.stack import LocalStack


def bare_change_stream(stack: LocalStack, client: MongoClient[Any], backlog: Backlog) -> Row:
    """`watch()` from before the backlog, RawBSONDocument (no decode), batch 1000: N inserts read."""
    coll = client[backlog.database][backlog.collection].with_options(
        codec_options=CodecOptions(document_class=RawBSONDocument))
    count = 0
    with Sampler(stack_roles(stack)) as sampler:
        started = time.perf_counter()
        with coll.watch([{"$match": {"operationType": "insert"}}], start_at_operation_time=backlog.before,
                        batch_size=1000) as stream:
            for _ in stream:
                count += 1
                if count == backlog.events:
                    break
        seconds = time.perf_counter() - started
    usage = sampler.stop()
    return Row("baseline: bare change stream", count, seconds, rate(count, seconds), variant=backlog.variant.key,
               cpu_us_per_event=usage.cpu_us_per_event("bench", count),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count),
               peak_rss_mb=usage.peak_rss_mb.get("bench", float("nan")), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores, note="watch(), RawBSONDocument, batch 1000")

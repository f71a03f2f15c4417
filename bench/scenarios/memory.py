"""Memory through a long backlog: one relay process drains 1,000,000 events; its RSS is sampled
throughout.

The relay runs as deployed, `outbox-relay run` in a process of its own (the partitioned
scenario's `group_catch_up` with one process and one partition), so its RSS is the relay's alone,
not the benchmark process's (which by then holds the earlier scenarios' clients and buffers).
Its memory is bounded by its batch limits (`RELAY_BATCH_MAX_EVENTS`, `RELAY_BATCH_MAX_BYTES`),
not by the backlog: this run shows it on a backlog ten times the default one. The row gives
events/s (from the process's launch), CPU per event of the relay process and of mongod, and the
peak of the RSS sampled every 25 ms; `extra` adds the last RSS sampled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pymongo import MongoClient

from bench.common import Row
from bench.events import Variant
from bench.scenarios.backlog import write_backlog
from bench.scenarios.partitions import group_catch_up
from relay.dev.stack import LocalStack


def memory_run(stack: LocalStack, client: MongoClient[Any], variant: Variant, events: int,
               run_id: str) -> tuple[Row, Row]:
    """(backlog set-up row, relay catch-up row) for a backlog of `events` events of `variant`."""
    long_variant = Variant("long", f"{variant.label}, {events:,} backlog", variant.payload_bytes,
                           variant.typed, events)
    backlog = write_backlog(client, f"bench_{run_id}_long", long_variant)
    row = group_catch_up(stack, client, backlog, run_id, partitions=1, processes=1, tag="long")
    x = row.extra
    return backlog.row, dataclasses.replace(
        row, scenario=f"relay process (outbox-relay run) catch-up, {events:,} backlog", kind="relay",
        peak_rss_mb=x["peak_rss_mb_per_process"][0] or float("nan"),
        extra={**x, "rss_after_mb": x["rss_last_mb_per_process"][0]})

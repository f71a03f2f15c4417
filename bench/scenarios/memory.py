"""Memory through a long backlog: the relay drains 1,000,000 events; its RSS is sampled throughout.

The relay's memory is bounded by its batch limits (`RELAY_BATCH_MAX_EVENTS`,
`RELAY_BATCH_MAX_BYTES`), not by the backlog: this run shows it on a backlog ten times the
default one. Same measurement as `catch_up.relay_catch_up` (events/s, CPU per event of this
process and of mongod, peak RSS sampled every 25 ms); the row's `extra` adds the RSS before and
after and the kernel's peak for the whole process so far (`ru_maxrss`).
"""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient

from bench.common import Row
from bench.events import Variant
from bench.scenarios.backlog import write_backlog
from bench.scenarios.catch_up import relay_catch_up
from relay.devstack import LocalStack


def memory_run(stack: LocalStack, client: MongoClient[Any], variant: Variant, events: int,
               run_id: str) -> tuple[Row, Row]:
    """(backlog set-up row, relay catch-up row) for a backlog of `events` events of `variant`."""
    long_variant = Variant("long", f"{variant.label}, {events:,} backlog", variant.payload_bytes,
                           variant.typed, events)
    backlog = write_backlog(client, f"bench_{run_id}_long", long_variant)
    row = relay_catch_up(stack, client, backlog, run_id, label=f"relay catch-up, {events:,} backlog")
    return backlog.row, row

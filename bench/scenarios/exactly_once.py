"""Relay catch-up in exactly-once mode, beside the at-least-once catch-up on the same backlog.

The same relay, settings and backlog as `bench.scenarios.catch_up` (timed from the relay's start
to the MongoDB checkpoint that covers the last backlog event), with RELAY_DELIVERY=exactly-once:
a Kafka transaction spans reads until RELAY_TRANSACTION_MAX_EVENTS / _BYTES / _MS (10,000 events,
16 MiB, 100 ms by default) and also writes the newest read's resume token to the offsets topic.
What it adds over at-least-once: `init_transactions` and the offsets topic read at
start, and per transaction AddPartitionsToTxn, the offsets record, EndTxn and the commit markers the
broker writes on every partition the transaction touched. The report's ratio relay / it is the
throughput cost. The messages are counted with a read_committed consumer once the time is taken.
"""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient

from bench.common import Row
from bench.scenarios.backlog import Backlog
from bench.scenarios.catch_up import relay_catch_up
from relay.dev.stack import LocalStack

LABEL = "relay catch-up, exactly-once (to checkpoint)"


def exactly_once_catch_up(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, run_id: str) -> Row:
    """The catch-up of `backlog` with RELAY_DELIVERY=exactly-once (Kafka transactions spanning reads)."""
    return relay_catch_up(stack, client, backlog, run_id, label=LABEL, delivery="exactly-once")

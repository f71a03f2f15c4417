"""Set-up of the catch-up scenarios: N outbox events written into a fresh outbox collection."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo import MongoClient
from pymongo.collection import Collection

from bench.common import CHUNK, Row, rate
from bench.events import Variant
from relay.outbox import Outbox


@dataclass
class Backlog:
    """What the catch-up scenarios need to know about a written backlog."""

    variant: Variant
    database: str
    collection: str
    events: int
    before: Timestamp            # a cluster time before the first backlog event
    last_token_data: str         # resume token `_data` of the last backlog event
    row: Row


def last_oplog_write(client: MongoClient[Any]) -> Timestamp:
    """The optime of the newest write on the primary (`hello.lastWrite.opTime.ts`)."""
    return client.admin.command("hello")["lastWrite"]["opTime"]["ts"]  # type: ignore[no-any-return]


def token_of_event(coll: Collection[Any], since: Timestamp, event_id: Any) -> str:
    """The resume token `_data` of the insert of `event_id`, read from a change stream at `since`.

    `since` must be at or before that insert (any earlier inserts are skipped).
    """
    pipeline = [{"$match": {"operationType": "insert"}}]
    with coll.watch(pipeline, start_at_operation_time=since, max_await_time_ms=1000) as stream:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            change = stream.try_next()
            if change is not None and change["documentKey"]["_id"] == event_id:
                return str(change["_id"]["_data"])
    raise TimeoutError(f"did not find the insert of {event_id} in the change stream")


def write_backlog(client: MongoClient[Any], database: str, variant: Variant, events: int | None = None) -> Backlog:
    """Insert the variant's events (`events` overrides its count) with `Outbox.add_many`, CHUNK per call."""
    count = variant.events if events is None else events
    factory = variant.factory()
    coll = client[database]["outbox"]
    outbox = Outbox(coll)
    outbox.init()
    before = last_oplog_write(client)
    chunk_start_ts = before
    last_id: Any = None
    started = time.perf_counter()
    with client.start_session(causal_consistency=False) as session:
        for first in range(0, count, CHUNK):
            if session.operation_time is not None:
                chunk_start_ts = session.operation_time  # at or before every insert that follows
            ids = outbox.add_many((factory.event(i) for i in range(first, min(first + CHUNK, count))),
                                  session=session)
            last_id = ids[-1]
    seconds = time.perf_counter() - started
    last_data = token_of_event(coll, chunk_start_ts, last_id)
    return Backlog(variant, database, "outbox", count, before, last_data,
                   Row("backlog insert (set-up)", count, seconds, rate(count, seconds), variant=variant.key,
                       kind="set-up", note=f"Outbox.add_many, {CHUNK} per call"))

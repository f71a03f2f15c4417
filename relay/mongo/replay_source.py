"""What `outbox-relay replay` reads from MongoDB, read-only: the oplog's window, an outbox's
documents by occurredAt, and its inserts through a change stream of its own (docs/replay.md).

Nothing here writes: no lease, no stored checkpoint, no change to the outbox. The change stream
is a cursor of its own (relay.mongo.cursor, the live relay's commands), never the live relay's
shared stream; its pipeline keeps the inserts of one outbox matching the replay's filters and
projects what the live relay's does, so each change (its resume token, cluster time, wall time
and document) is the one the live relay read, and the encoder builds the same message from it.
Documents read from the collection come as a rescan's (relay.mongo.rescan): synthetic
positions, no cluster time.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.errors import ExecutionTimeout, PyMongoError

from relay.core.change import Change
from relay.core.errors import Action, RelayError, ReopenableStreamError, ServerUnreachableError
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.core.positions import ClusterTime, token_cluster_time
from relay.core.restarts import RestartPolicy
from relay.mongo.codecs import RAW_CHANGE_CODEC, read_changes
from relay.mongo.cursor import Cursor, oplog_start
from relay.mongo.errors import describe, relay_error, resumable
from relay.mongo.lease import CLEANED_UP_BEFORE
from relay.mongo.pipeline import PIPELINE
from relay.mongo.rescan import rescan_changes

log = logging.getLogger("relay")

INITIATING_SET = "initiating set"  # the message of a replica set's first oplog entry (replSetInitiate)
COMPLETE_OPLOG_SCAN_MS = 2000  # the longest the gap check scans the oplog for deletes of an outbox


@dataclass(frozen=True)
class Filters:
    """The replay's selection inside an outbox: aggregate ids and types (empty: every one), by
    the outbox's field names (RELAY_FIELD_*)."""

    aggregate_id_field: str
    aggregate_type_field: str
    occurred_at_field: str
    aggregate_ids: tuple[str, ...] = ()
    aggregate_types: tuple[str, ...] = ()

    def query(self, prefix: str = "") -> dict[str, Any]:
        """The filters as a query on the documents (`prefix`: "fullDocument." in a change)."""
        query: dict[str, Any] = {}
        if self.aggregate_ids:
            query[prefix + self.aggregate_id_field] = {"$in": list(self.aggregate_ids)}
        if self.aggregate_types:
            query[prefix + self.aggregate_type_field] = {"$in": list(self.aggregate_types)}
        return query


def oplog_window_start(client: MongoClient[Any]) -> Timestamp:
    """The cluster time of the oplog's oldest entry (a change stream can start no earlier)."""
    return oplog_start(client)


def cluster_now(client: MongoClient[Any]) -> Timestamp:
    """The cluster time of the newest write on the server the client talks to (a replica set's
    `hello`: lastWrite.opTime): a stream whose post-batch token reaches it has seen every
    change committed before now."""
    reply = client.admin.command("hello")
    return reply["lastWrite"]["opTime"]["ts"]  # type: ignore[no-any-return]


def oldest_occurred(outbox: Collection[Any], filters: Filters) -> dt.datetime | None:
    """The occurredAt of the outbox's oldest document among the filtered ones (None: none)."""
    field = filters.occurred_at_field
    doc = outbox.find_one(filters.query(), projection={field: 1}, sort=[(field, 1)])
    if doc is None or not isinstance(doc.get(field), dt.datetime):
        return None
    return _aware(doc[field])


def complete_oplog(client: MongoClient[Any], namespace: Namespace, max_time_ms: int = COMPLETE_OPLOG_SCAN_MS) -> bool:
    """Whether nothing can have been removed from `namespace` since the replica set began: its
    oplog has never rolled over (its oldest entry is the replica set's first, `initiating set`)
    and holds no delete of the outbox's documents (a scan of the oplog, bounded by `max_time_ms`:
    False when it could not finish). Documents written before the replica set was initiated (a
    standalone server turned into one) are not seen."""
    oplog = client.local["oplog.rs"]
    first = oplog.find_one({}, projection={"op": 1, "o": 1}, sort=[("$natural", 1)])
    if first is None or first.get("op") != "n" or (first.get("o") or {}).get("msg") != INITIATING_SET:
        return False
    deletes = {"op": "d", "ns": str(namespace)}
    query = {"$or": [deletes, {"op": "c", "o.applyOps": {"$elemMatch": deletes}}]}
    try:
        return oplog.find_one(query, projection={"_id": 1}, max_time_ms=max_time_ms) is None
    except ExecutionTimeout:
        return False


def ttl_index(outbox: Collection[Any]) -> tuple[str, int] | None:
    """A TTL index of the outbox (on any field): its field and expireAfterSeconds; None: none."""
    for index in outbox.list_indexes():
        if "expireAfterSeconds" in index:
            return next(iter(index["key"])), int(index["expireAfterSeconds"])
    return None


def cleanup_record(leases: Collection[Any], lease_ids: Sequence[str]) -> tuple[bool, dt.datetime | None]:
    """What the outbox's lease documents record of its clean-up (relay.mongo.lease,
    `cleanedUpBefore`): whether it is known, and the newest cutoff a pass deleted below (None:
    clean-up never deleted anything). Known when every lease document of the outbox records it; a
    lease that has no document yet never had a stored checkpoint, so nothing was cleaned up under
    it (clean-up by checkpoint and `outbox prune` need one)."""
    docs = list(leases.find({"_id": {"$in": list(lease_ids)}}, projection={CLEANED_UP_BEFORE: 1}))
    if any(CLEANED_UP_BEFORE not in d for d in docs):
        return False, None
    cutoffs = [_aware(d[CLEANED_UP_BEFORE]) for d in docs if isinstance(d[CLEANED_UP_BEFORE], dt.datetime)]
    return True, max(cutoffs, default=None)


def count_documents(outbox: Collection[Any], filters: Filters, since: dt.datetime, until: dt.datetime) -> int:
    """How many filtered documents occurred in `[since, until]`: the replay's expected total (the
    oplog part selects by commit time and may hold documents clean-up removed since)."""
    field = filters.occurred_at_field
    return outbox.count_documents({**filters.query(), field: {"$gte": since, "$lte": until}})


def collection_changes(
    outbox: Collection[Any], filters: Filters, start: dt.datetime, end: dt.datetime, after: tuple[Any, Any] | None
) -> Iterator[Change]:
    """The filtered documents with occurredAt in `[start, end)`, in (occurredAt, _id) order, as a
    rescan serves them; `after` (occurredAt, _id): only those after that document (a resume)."""
    field = filters.occurred_at_field
    query: dict[str, Any] = {**filters.query(), field: {"$gte": start, "$lt": end}}
    if after is not None:
        at, last = after
        query["$or"] = [{field: {"$gt": at}}, {field: at, "_id": {"$gt": last}}]
    return rescan_changes(outbox, field, query)


def document_key(change: Change, occurred_at_field: str) -> tuple[Any, Any]:
    """A collection change's (occurredAt, _id), where a resume continues after it."""
    doc = RawBSONDocument(change.document, RAW_CHANGE_CODEC)
    return doc[occurred_at_field], doc["_id"]


@dataclass(frozen=True)
class Recovery:
    """The live relay's settings the replay's change stream recovers with: the restart backoff's
    longest wait (RELAY_RESTART_BACKOFF_MAX_S), how long MongoDB may fail to serve the stream before
    the replay stops (RELAY_CONNECT_TIMEOUT_S), and the replay's stop flag (it ends a wait)."""

    max_backoff_s: float
    give_up_after_s: float
    stop: threading.Event


class OplogPart:
    """The inserts of one outbox through a change stream opened at `start`, up to the cluster
    time `until` (included), whose wall time lies in `[since_ms, until_ms]`; with `occurred_from`,
    only documents that occurred at or after it; with `after` (a token's `_data`), only changes
    after it (a resume).

    `batches()` yields them in commit order, in batches of at most `batch_events`, and ends once a
    read's post-batch token reaches `until` (or, early, once the replay is asked to stop while it
    waits to open the stream again: the caller checks its stop flag).

    Recovery, the live reader's rule (docs/architecture.md, "Recovery bound"; tested under
    `failCommand` on getMore in tests/integration/test_replay.py): a read that fails with a
    resumable error (relay.mongo.errors.resumable) opens the stream again **once, at once**, at the
    last change handed out (what was handed is skipped). If the read after that fails too, or an
    open fails, before any read succeeds, the stream opens again under relay.core.restarts'
    RestartPolicy, as a live loop restarts: the first time at once (so too the first after a read
    that handed out changes), each further one 0.2 s doubling plus up to 0.2 s of jitter, at most
    RELAY_RESTART_BACKOFF_MAX_S; a reopenable code (CappedPositionLost, ChangeStreamFatalError) may
    be met once without progress (RestartPolicy.check_reopen, then RepeatedStreamError, exit 4).
    Where a relay runs on, a replay ends: once no read has succeeded for RELAY_CONNECT_TIMEOUT_S
    since the first failure, it stops with ServerUnreachableError (exit 3) naming the last error as
    the live relay names it (relay.mongo.errors.describe). Any other error stops it at once as the
    relay error it amounts to (relay.mongo.errors.relay_error: HistoryLostError when `start` left
    the oplog, exit 4; ServerRefusedError, exit 5; PermissionDeniedError, exit 2).
    """

    def __init__(
        self,
        client: MongoClient[Any],
        namespace: Namespace,
        filters: Filters,
        window: tuple[Timestamp, Timestamp],
        wall_ms: tuple[int, int],
        recovery: Recovery,
        occurred_from: dt.datetime | None = None,
        after: str | None = None,
        batch_events: int = 1000,
        await_ms: int = 500,
    ) -> None:
        match: dict[str, Any] = {"operationType": "insert", **filters.query("fullDocument.")}
        if occurred_from is not None:
            match[f"fullDocument.{filters.occurred_at_field}"] = {"$gte": occurred_from}
        stages = [{"$match": match}, PIPELINE[1]]
        self._namespace = namespace
        self._stream_cursor = Cursor(client, namespace.database, namespace.collection, stages, await_ms)
        self._start, self._until = window
        self._since_ms, self._until_ms = wall_ms
        self._after = after
        self._batch = batch_events
        self._recovery = recovery
        self._restarts = RestartPolicy(recovery.max_backoff_s, self._wait, self._restarting)
        self._reopened = False  # the one reopen at once since the last read that succeeded was made
        self._failing_since: float | None = None  # the first failure since the last read that succeeded

    def batches(self) -> Iterator[list[Change]]:
        """The part's changes, batch by batch (the class docstring)."""
        until = ClusterTime(self._until.time, self._until.inc)
        opened = False
        try:
            while True:
                try:
                    if not opened:
                        self._stream_cursor.open(self._reopen_at() or self._start)
                        opened = True
                    read = self._stream_cursor.read(self._batch)
                except (PyMongoError, RelayError) as exc:
                    if not self._recover(exc, reading=opened):
                        return
                    opened = False
                    continue
                self._reopened, self._failing_since = False, None
                changes, _ = read_changes(read.changes)
                kept, ended = self._kept(changes, until)
                if kept:
                    self._after = kept[-1].position["_data"]
                    self._restarts.progressed()
                    yield kept
                reached = token_cluster_time(read.token)
                if ended or not self._stream_cursor.alive or (reached is not None and reached >= until):
                    return
        finally:
            self._stream_cursor.close()

    def _recover(self, exc: PyMongoError | RelayError, reading: bool) -> bool:
        """After a failed open or read (`reading`), the recovery rule of the class docstring: True
        to open the stream again, False when the replay was asked to stop meanwhile; raises the
        relay error that ends the part."""
        now = time.monotonic()
        self._failing_since = now if self._failing_since is None else self._failing_since
        if reading and isinstance(exc, PyMongoError) and resumable(exc) and not self._reopened:
            self._reopened = True
            log.info("replay: the change stream of %s resumed after: %s", self._namespace, describe(exc))
            return True
        error = exc if isinstance(exc, RelayError) else relay_error(exc)
        if isinstance(error, ReopenableStreamError):
            self._restarts.check_reopen(error)  # raises RepeatedStreamError when it repeats without progress
        elif error.action is not Action.RESTART:
            if error is exc:
                raise error
            raise error from exc
        if now - self._failing_since >= self._recovery.give_up_after_s:
            raise ServerUnreachableError(
                f"MongoDB has not served the replay's change stream of {self._namespace} for "
                f"{now - self._failing_since:.0f} s ({env_name('connect_timeout_s')}): {describe(exc)}"
            ) from exc
        self._restarts.restart(error)
        return not self._recovery.stop.is_set()

    def _wait(self, seconds: float) -> None:
        self._recovery.stop.wait(seconds)  # the replay's stop ends it

    def _restarting(self, error: BaseException, seconds: float) -> None:
        log.warning(
            "replay: the change stream of %s failed again: %s; opening it again in %.1f s",
            self._namespace,
            error,
            seconds,
        )

    def _kept(self, changes: Sequence[Change], until: ClusterTime) -> tuple[list[Change], bool]:
        """The changes of a read inside the range and not handed out before; and whether the read
        went past `until` (the part is done)."""
        kept: list[Change] = []
        for change in changes:
            if change.cluster_time is not None and change.cluster_time > until:
                return kept, True
            if self._after is not None and change.position["_data"] <= self._after:
                continue
            if change.wall_ms >= 0 and not self._since_ms <= change.wall_ms <= self._until_ms:
                continue
            kept.append(change)
        return kept, False

    def _reopen_at(self) -> Timestamp | None:
        """The cluster time of the last change handed out (None: none yet)."""
        at = token_cluster_time({"_data": self._after}) if self._after else None
        return None if at is None else Timestamp(at.time, at.inc)


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def wall_ms(moment: dt.datetime) -> int:
    """A time as Unix milliseconds (a change's wall time's unit)."""
    return int(moment.timestamp() * 1000)


def timestamp_at(moment: dt.datetime) -> Timestamp:
    """The first cluster time of `moment`'s second."""
    return Timestamp(int(moment.timestamp()), 0)


__all__ = [
    "Filters",
    "OplogPart",
    "Recovery",
    "cleanup_record",
    "cluster_now",
    "collection_changes",
    "complete_oplog",
    "count_documents",
    "document_key",
    "oldest_occurred",
    "oplog_window_start",
    "timestamp_at",
    "ttl_index",
    "wall_ms",
]

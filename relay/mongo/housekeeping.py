"""Keeping the outbox small without losing an event: clean-up by the stored checkpoint, and
the headroom a TTL index leaves (RELAY_OUTBOX_RETENTION; docs/outbox-cleanup.md).

A document may be deleted only when the stored checkpoint of its partition covers it and it is
older than the retention. Documents do not store when they were inserted, so coverage is read
from the oplog, which records every insert with its cluster time (`ts`):

- The stored checkpoint is the lease document's: its token and that token's cluster time T
  (`tokenClusterTime`). A partition without a stored checkpoint, or whose checkpoint is older
  than the oldest oplog entry (history lost, a rescan under way), has no known checkpoint:
  nothing of it is deleted, and `outbox prune` refuses.
- Uncovered documents are those whose insert the stream has not passed: inserts at a cluster
  time >= T, found in the oplog among the candidates of the pass. A transaction too large for one
  oplog entry is written in several, chained by `prevOpTime`, and its events take the cluster
  time of the last one: the chain of every such entry at or after T is followed back, so its
  earlier inserts count as uncovered too. Inserts at exactly T are kept (a token can sit inside
  a transaction whose inserts share one cluster time): the next checkpoint covers them.
- A pass lists candidates first (documents of the partition older than the retention), then
  reads the oplog: every candidate existed before the read, so its insert is in the range read
  unless it was inserted before T. Then it deletes the candidates not found uncovered.

Invariant (enforced by `deletable`): an id is deleted only if it is absent from the inserts at or
after T (and from the transactions ending there), so its insert was before T and the stored
checkpoint, which only moves forward, covers it. The checkpoint read is the STORED one: a
checkpoint delivered but still held by the process (relay.core.coalescer, up to RELAY_CHECKPOINT_INTERVAL_MS) is not in the lease document
yet, so clean-up waits for it, and a crash that loses it never leaves a deleted document uncovered.
Exactly-once mode stores the same checkpoint in MongoDB (it may lag the offsets record: clean-up
then waits for it, which is safe).

Before a pass deletes its first document, it records its cutoff in the partition's lease document
(`cleanedUpBefore`, forward only: relay.mongo.lease), so `replay` knows what clean-up may have
removed (nothing that occurred at or after it) and when it never ran.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bson import Timestamp
from pymongo import ASCENDING, MongoClient
from pymongo.collection import Collection

from relay.core.errors import OperatorActionError
from relay.core.namespace import Namespace
from relay.core.partitions import Scope, partitions
from relay.core.positions import ClusterTime
from relay.mongo.config import MongoConfig, OutboxCleanupConfig
from relay.mongo.cursor import oplog_start
from relay.mongo.lease import CLEANED_UP_BEFORE, cluster_time
from relay.mongo.pipeline import scan_filter

log = logging.getLogger("relay.outbox")

_NO_TIME = Timestamp(0, 0)


class CheckpointUnknownError(OperatorActionError):
    """Raised by `outbox prune` while a partition's stored checkpoint is not known."""


@dataclass(frozen=True)
class StoredCheckpoint:
    """A partition's stored checkpoint as clean-up sees it: its cluster time."""

    lease_id: str
    time: ClusterTime | None  # None: not known
    why: str = ""  # why it is not known


def stored_checkpoint(client: MongoClient[Any], leases: Collection[Any], lease_id: str) -> StoredCheckpoint:
    """The stored checkpoint's cluster time, if it is known and still in the oplog."""
    doc = leases.find_one({"_id": lease_id}, projection={"resumeToken": 1, "tokenClusterTime": 1})
    if doc is None or doc.get("resumeToken") is None:
        return StoredCheckpoint(lease_id, None, "no checkpoint stored yet")
    stored = cluster_time(doc.get("tokenClusterTime"))
    if stored is None:
        return StoredCheckpoint(lease_id, None, "the checkpoint has no cluster time")
    start = oplog_start(client)
    if ClusterTime(start.time, start.inc) > stored:
        return StoredCheckpoint(
            lease_id, None, "the checkpoint is older than the oplog (history lost; a rescan re-publishes)"
        )
    return StoredCheckpoint(lease_id, stored)


def _inserts(namespace: Namespace, ids: Sequence[Any] | None) -> dict[str, Any]:
    """An oplog filter for inserts into `namespace` (alone or inside a transaction's applyOps)."""
    plain: dict[str, Any] = {"op": "i", "ns": str(namespace)}
    nested: dict[str, Any] = {"op": "i", "ns": str(namespace)}
    if ids is not None:
        plain["o._id"] = {"$in": list(ids)}
        nested["o._id"] = {"$in": list(ids)}
    return {"$or": [plain, {"op": "c", "o.applyOps": {"$elemMatch": nested}}]}


def _inserted_ids(entry: Mapping[str, Any], namespace: Namespace) -> Iterable[Any]:
    if entry.get("op") == "i":
        yield entry["o"]["_id"]
        return
    for op in entry.get("o", {}).get("applyOps", []):
        if op.get("op") == "i" and op.get("ns") == str(namespace):
            yield op["o"]["_id"]


def uncovered(client: MongoClient[Any], namespace: Namespace, since: ClusterTime, ids: Sequence[Any]) -> set[Any]:
    """Which of `ids` the checkpoint at `since` does not cover: inserted by an oplog entry at or
    after it, or by a transaction written in several entries whose last one is (its events take
    that cluster time)."""
    oplog = client.local["oplog.rs"]
    start = Timestamp(since.time, since.inc)
    found: set[Any] = set()
    for entry in oplog.find({"ts": {"$gte": start}, **_inserts(namespace, ids)}):
        found.update(_inserted_ids(entry, namespace))
    chained = {"ts": {"$gte": start}, "op": "c", "o.applyOps": {"$exists": True}, "prevOpTime.ts": {"$gt": _NO_TIME}}
    for entry in oplog.find(chained, projection={"prevOpTime": 1}):
        previous = entry["prevOpTime"]["ts"]
        while previous > _NO_TIME and previous < start:
            earlier = oplog.find_one({"ts": previous})
            if earlier is None:
                break  # rolled off the oplog: so did the checkpoint's history (checkpoint unknown)
            found.update(_inserted_ids(earlier, namespace))
            previous = earlier.get("prevOpTime", {}).get("ts", _NO_TIME)
    return found & set(ids)


def deletable(candidates: Sequence[Any], not_covered: set[Any]) -> list[Any]:
    """The candidates the stored checkpoint covers (the invariant of the module docstring)."""
    return [c for c in candidates if c not in not_covered]


def oldest_undelivered(client: MongoClient[Any], namespace: Namespace, since: ClusterTime) -> Mapping[str, Any] | None:
    """The first outbox document inserted at or after `since` (from the oplog), or None."""
    oplog = client.local["oplog.rs"]
    entry = oplog.find_one(
        {"ts": {"$gte": Timestamp(since.time, since.inc)}, **_inserts(namespace, None)}, sort=[("$natural", ASCENDING)]
    )
    if entry is None:
        return None
    if entry.get("op") == "i":
        return entry["o"]  # type: ignore[no-any-return]
    for op in entry["o"]["applyOps"]:
        if op.get("op") == "i" and op.get("ns") == str(namespace):
            return op["o"]  # type: ignore[no-any-return]
    return None


def ttl_seconds(outbox: Collection[Any], occurred_at: str) -> int | None:
    """The expireAfterSeconds of a TTL index on the occurrence time, if there is one."""
    for index in outbox.list_indexes():
        keys = list(index["key"].keys())
        if keys == [occurred_at] and "expireAfterSeconds" in index:
            return int(index["expireAfterSeconds"])
    return None


@dataclass
class PassResult:
    """What one clean-up pass over one partition found and did."""

    lease_id: str
    checkpoint: StoredCheckpoint
    candidates: int = 0
    deleted: int = 0  # or, in a dry run, would delete
    kept_uncovered: int = 0


class Cleaner:
    """Deletes the documents a partition's stored checkpoint covers in the outbox `namespace` (one
    pass at a time)."""

    def __init__(
        self,
        client: MongoClient[Any],
        namespace: Namespace,
        leases: Collection[Any],
        occurred_at: str,
        config: OutboxCleanupConfig,
    ) -> None:
        self.client, self.namespace, self._leases = client, namespace, leases
        self.outbox: Collection[Any] = client[namespace.database][namespace.collection]
        self.occurred_at, self._config = occurred_at, config

    def checkpoint(self, lease_id: str) -> StoredCheckpoint:
        return stored_checkpoint(self.client, self._leases, lease_id)

    def run_pass(
        self,
        lease_id: str,
        documents: Mapping[str, Any] | None,
        retention_s: float,
        dry_run: bool = False,
        budget_s: float | None = None,
    ) -> PassResult:
        """Delete (or count, with `dry_run`) the partition's covered documents older than
        `retention_s`, in batches, for at most `budget_s` (no limit: None)."""
        checkpoint = self.checkpoint(lease_id)
        result = PassResult(lease_id, checkpoint)
        if checkpoint.time is None:
            return result
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=retention_s)
        query: dict[str, Any] = {self.occurred_at: {"$lt": cutoff}}
        if documents:
            query.update(documents)
        deadline = None if budget_s is None else time.monotonic() + budget_s
        after: Any = None  # in a dry run nothing goes away: page through by _id instead
        while deadline is None or time.monotonic() < deadline:
            page = dict(query) if after is None else {**query, "_id": {"$gt": after}}
            cursor = self.outbox.find(page, projection={"_id": 1}).limit(self._config.batch)
            candidates = [d["_id"] for d in (cursor.sort("_id", ASCENDING) if dry_run else cursor)]
            if not candidates:
                break
            result.candidates += len(candidates)
            not_covered = uncovered(self.client, self.namespace, checkpoint.time, candidates)
            ids = deletable(candidates, not_covered)
            result.kept_uncovered += len(not_covered)
            if dry_run:
                result.deleted += len(ids)
                after = candidates[-1]
                continue
            if not ids:
                break  # the rest waits for the checkpoint to move on
            result.deleted += self._delete(lease_id, ids, cutoff, first=not result.deleted)
            if len(candidates) < self._config.batch:
                break
        return result

    def _delete(self, lease_id: str, ids: list[Any], cutoff: dt.datetime, first: bool) -> int:
        """Delete `ids`; a pass's first delete records its cutoff in the lease document before it,
        so no delete goes unrecorded (`cleanedUpBefore`, relay.mongo.lease)."""
        if first:
            self._leases.update_one({"_id": lease_id}, {"$max": {CLEANED_UP_BEFORE: cutoff}})
        return self.outbox.delete_many({"_id": {"$in": ids}}).deleted_count


def cleaner_for(
    client: MongoClient[Any], mongo: MongoConfig, namespace: Namespace, occurred_at: str, config: OutboxCleanupConfig
) -> Cleaner:
    """The Cleaner of the outbox `namespace` (its leases in the state database)."""
    return Cleaner(client, namespace, mongo.leases(client), occurred_at, config)


def shares_of(namespace: Namespace, count: int, aggregate_id_field: str) -> list[tuple[str, dict[str, Any] | None]]:
    """Every partition's lease id and documents (RELAY_PARTITIONS = `count`) of the outbox `namespace`."""
    return [(Scope(namespace, p).lease_id, scan_filter(p, aggregate_id_field)) for p in partitions(count)]


class OutboxReport(Protocol):
    """Where the checks report (relay.ops.outbox_checks.OutboxMetrics)."""

    def size(self, documents: int) -> None: ...
    def oldest_undelivered(self, age_s: float) -> None: ...
    def ttl_headroom(self, headroom_s: float | None, warn_below_s: float) -> None: ...
    def deleted(self, count: int) -> None: ...
    def cleanup_error(self, exc: BaseException) -> None: ...


@dataclass
class Watched:
    """One outbox the housekeeper measures and cleans up: its cleaner, its partitions' lease ids
    and documents (`shares_of`), and where its checks report."""

    cleaner: Cleaner
    shares: Sequence[tuple[str, Mapping[str, Any] | None]]
    report: OutboxReport


class Housekeeper:
    """A thread that, every RELAY_OUTBOX_CHECK_INTERVAL_S, measures each outbox (size, age of the
    oldest undelivered event, TTL headroom; on every replica) and, with RELAY_OUTBOX_RETENTION,
    cleans up the partitions this replica leads. It never touches the loops: a slow delete cannot
    stall publishing, and every decision rests on the stored checkpoint alone."""

    def __init__(
        self, watched: Sequence[Watched], leases: Collection[Any], instance_id: str, config: OutboxCleanupConfig
    ) -> None:
        self._watched, self._leases, self._instance = list(watched), leases, instance_id
        self._config = config
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="relay-outbox-housekeeping", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _led(
        self, shares: Sequence[tuple[str, Mapping[str, Any] | None]]
    ) -> list[tuple[str, Mapping[str, Any] | None]]:
        now = dt.datetime.now(dt.UTC)
        held = {
            d["_id"]
            for d in self._leases.find(
                {"_id": {"$in": [lid for lid, _ in shares]}, "owner": self._instance},
                projection={"expiresAt": 1},
            )
            if d.get("expiresAt") is not None and _aware(d["expiresAt"]) > now
        }
        return [(lid, docs) for lid, docs in shares if lid in held]

    def _run(self) -> None:
        while not self._stop.wait(self._config.check_interval_s):
            for watched in self._watched:
                try:
                    self.check_once(watched)
                except Exception as exc:  # noqa: BLE001 - a failed check must not end the checks
                    watched.report.cleanup_error(exc)
                    log.warning(
                        "outbox check of %s failed (retrying in %.0fs): %s",
                        watched.cleaner.namespace,
                        self._config.check_interval_s,
                        exc,
                    )

    def check_once(self, watched: Watched) -> list[PassResult]:
        """One round for one outbox: measure it (any replica: a standby sees a stalled leader's
        outbox age), then clean up the partitions this replica leads (if retention is set)."""
        c, report = watched.cleaner, watched.report
        report.size(c.outbox.estimated_document_count())
        self._measure(watched, [c.checkpoint(lid) for lid, _ in watched.shares])
        retention = self._config.retention_s
        if retention is None:
            return []
        results = []
        for lid, documents in self._led(watched.shares):
            result = c.run_pass(lid, documents, retention, budget_s=self._config.pass_budget_s)
            if result.deleted:
                report.deleted(result.deleted)
                log.info("outbox clean-up: deleted %d documents covered by %s", result.deleted, lid)
            results.append(result)
        return results

    def _measure(self, watched: Watched, checkpoints: Sequence[StoredCheckpoint]) -> None:
        c, report = watched.cleaner, watched.report
        known = [p.time for p in checkpoints if p.time is not None]
        if not known:
            return
        oldest = oldest_undelivered(c.client, c.namespace, min(known))
        now = dt.datetime.now(dt.UTC)
        occurred = None if oldest is None else oldest.get(c.occurred_at)
        age = 0.0 if not isinstance(occurred, dt.datetime) else max((now - _aware(occurred)).total_seconds(), 0.0)
        report.oldest_undelivered(age)
        ttl = ttl_seconds(c.outbox, c.occurred_at)
        report.ttl_headroom(None if ttl is None else ttl - age, self._config.ttl_headroom_warn_s)


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)

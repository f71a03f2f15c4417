"""The per-aggregate state view: its definition, its Parquet snapshots, its MongoDB read model.

Definition. For each `(aggregateType, aggregateId)`, over the distinct events of the event
table (duplicates by event id are dropped before, so every event counts once):
  lastEventId, lastEventType, lastPayload (JSON text), lastOccurredAt, lastPosition,
  lastClusterTime   - of the event with the greatest `source.position` (commit order), and
  eventCount        - how many distinct events the aggregate has.
Its version is `(lastPosition, eventCount)`, compared in that order. Both parts only grow as
events are added, so a newer state always has a greater version: the position decides, and the
count breaks the tie when an event older than the last one arrives late (it raises the count but
must not replace the last event).

Writes are version-conditioned (the blog post's denormalized views): a row replaces the stored
one only if its version is greater. A stale row (an older micro-batch replayed after a crash, a
query replaying the topic from scratch) and an equal row (a duplicate) change nothing, so every
write here is idempotent and can be repeated any number of times.

- Parquet: `<state>/snapshot-<batch id>/` holds the whole view as of that micro-batch (written
  with `_SUCCESS` last); readers take the newest complete snapshot (`read_state`). Each batch
  merges its updated rows into the previous snapshot by the version rule and writes a new one,
  so a batch replayed after a crash rewrites the same snapshot. Older snapshots are deleted
  except the one before the newest. Cost: the view is rewritten once per micro-batch that
  changed it.
- MongoDB: one document per aggregate, `_id: {aggregateType, aggregateId}`, written with an
  upsert conditioned on the stored version being smaller; when the stored document is newer
  the upsert's insert attempt fails with a duplicate key on `_id`, which is how MongoDB says
  "not newer" (those errors are counted as stale, any other error fails the batch).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relay.mongo.errors import DUPLICATE_KEY

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.collection import Collection
    from pyspark.sql import DataFrame, Row, SparkSession

STATE_KEY = ("aggregateType", "aggregateId")
STATE_COLUMNS = (
    *STATE_KEY,
    "lastEventId",
    "lastEventType",
    "lastPayload",
    "lastOccurredAt",
    "lastPosition",
    "lastClusterTime",
    "eventCount",
)
_SNAPSHOT_PREFIX = "snapshot-"
_MONGO_CHUNK = 1000


# ---- the definition --------------------------------------------------------------------------


def aggregate_state(events: DataFrame) -> DataFrame:
    """`STATE_COLUMNS` per aggregate from distinct events (the event table's columns).

    On a stream this is a stateful aggregation: in update mode each micro-batch emits the
    complete current state of the aggregates it touched.
    """
    from pyspark.sql import functions as F

    last = F.struct(
        F.col("id").alias("lastEventId"),
        F.col("eventType").alias("lastEventType"),
        F.col("payload").alias("lastPayload"),
        F.col("occurredAt").alias("lastOccurredAt"),
        F.col("source.position").alias("lastPosition"),
        F.col("source.clusterTime").alias("lastClusterTime"),
    )
    return (
        events.groupBy(*STATE_KEY)
        .agg(F.max_by(last, F.col("source.position")).alias("last"), F.count(F.lit(1)).alias("eventCount"))
        .select(*STATE_KEY, "last.*", "eventCount")
    )


def newest_per_aggregate(states: DataFrame) -> DataFrame:
    """Of several state rows per aggregate, the one with the greatest version."""
    from pyspark.sql import functions as F

    version = F.struct(F.col("lastPosition"), F.col("eventCount"))
    row = F.struct(*[F.col(c) for c in STATE_COLUMNS])
    return states.groupBy(*STATE_KEY).agg(F.max_by(row, version).alias("s")).select("s.*")


# ---- Parquet snapshots -----------------------------------------------------------------------


class HadoopFs:
    """The few file-system calls the snapshots need, through Hadoop (any Spark-supported FS)."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm: Any = spark.sparkContext._jvm
        assert jvm is not None, "a classic (JVM) Spark session"
        self._jvm = jvm
        self._root = self._jvm.org.apache.hadoop.fs.Path(root)
        self._fs = self._root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, *names: str) -> Any:
        p = self._root
        for name in names:
            p = self._jvm.org.apache.hadoop.fs.Path(p, name)
        return p

    def children(self, directories_only: bool = True) -> list[str]:
        """Names of the entries under the root (folders only by default); [] if it is absent."""
        if not self._fs.exists(self._root):
            return []
        return [
            s.getPath().getName() for s in self._fs.listStatus(self._root) if s.isDirectory() or not directories_only
        ]

    def exists(self, *names: str) -> bool:
        return bool(self._fs.exists(self.path(*names)))

    def delete(self, *names: str) -> None:
        self._fs.delete(self.path(*names), True)

    def mkdirs(self, *names: str) -> None:
        self._fs.mkdirs(self.path(*names))


class ParquetStateSnapshots:
    """The state view as Parquet snapshots under `path` (see the module docstring)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self._spark = spark
        self._path = path.rstrip("/")
        self._fs = HadoopFs(spark, self._path)

    def _complete(self) -> list[int]:
        ids = [
            int(name[len(_SNAPSHOT_PREFIX) :])
            for name in self._fs.children()
            if name.startswith(_SNAPSHOT_PREFIX) and name[len(_SNAPSHOT_PREFIX) :].isdigit()
        ]
        return sorted(i for i in ids if self._fs.exists(self._name(i), "_SUCCESS"))

    @staticmethod
    def _name(batch_id: int) -> str:
        return f"{_SNAPSHOT_PREFIX}{batch_id:012d}"

    def _location(self, batch_id: int) -> str:
        return f"{self._path}/{self._name(batch_id)}"

    def latest(self, before: int | None = None) -> int | None:
        """The batch id of the newest complete snapshot (older than `before` if given)."""
        ids = [i for i in self._complete() if before is None or i < before]
        return ids[-1] if ids else None

    def exists(self) -> bool:
        return self.latest() is not None

    def read(self) -> DataFrame | None:
        """The view as of the newest complete snapshot, or None before the first one."""
        newest = self.latest()
        return None if newest is None else self._spark.read.parquet(self._location(newest))

    def write(self, updates: DataFrame, batch_id: int) -> None:
        """Merge `updates` (STATE_COLUMNS) into the snapshot before `batch_id`, by version,
        and store the result as the snapshot of `batch_id`; repeatable for the same batch."""
        previous = self.latest(before=batch_id)
        merged = updates.select(*STATE_COLUMNS)
        if previous is not None:
            merged = newest_per_aggregate(
                self._spark.read.parquet(self._location(previous)).select(*STATE_COLUMNS).unionByName(merged)
            )
        merged.write.mode("overwrite").parquet(self._location(batch_id))
        for old in self._complete():
            if previous is not None and old < previous:
                self._fs.delete(self._name(old))


def read_state(spark: SparkSession, path: str) -> DataFrame | None:
    """The Parquet state view at `path` (newest complete snapshot), or None if there is none."""
    return ParquetStateSnapshots(spark, path).read()


# ---- MongoDB read model ----------------------------------------------------------------------


@dataclass(frozen=True)
class UpsertResult:
    """What a conditional upsert did: rows applied (inserted or replaced) and rows found stale."""

    applied: int = 0
    stale: int = 0

    def __add__(self, other: UpsertResult) -> UpsertResult:
        return UpsertResult(self.applied + other.applied, self.stale + other.stale)


def state_document(row: Mapping[str, Any]) -> dict[str, Any]:
    """The MongoDB document for one state row (lastOccurredAt given as epoch milliseconds in
    `lastOccurredAtMs`, lastPayload as JSON text, stored parsed when it is valid JSON)."""
    from bson import json_util

    payload: Any = row["lastPayload"]
    with contextlib.suppress(ValueError):  # else keep the text
        payload = json_util.loads(payload) if payload is not None else None
    millis = row["lastOccurredAtMs"]
    return {
        "_id": {"aggregateType": row["aggregateType"], "aggregateId": row["aggregateId"]},
        "aggregateType": row["aggregateType"],
        "aggregateId": row["aggregateId"],
        "lastEventId": row["lastEventId"],
        "lastEventType": row["lastEventType"],
        "lastPayload": payload,
        "lastOccurredAt": None if millis is None else dt.datetime.fromtimestamp(millis / 1000, dt.UTC),
        "lastPosition": row["lastPosition"],
        "lastClusterTime": row["lastClusterTime"],
        "eventCount": row["eventCount"],
    }


def _conditional_update(doc: Mapping[str, Any]) -> Any:
    from pymongo import UpdateOne

    position, count = doc["lastPosition"], doc["eventCount"]
    newer = {"$or": [{"lastPosition": {"$lt": position}}, {"lastPosition": position, "eventCount": {"$lt": count}}]}
    fields = {k: v for k, v in doc.items() if k != "_id"}
    return UpdateOne({"_id": doc["_id"], **newer}, {"$set": fields}, upsert=True)


def _flush(collection: Collection[Any], ops: list[Any]) -> UpsertResult:
    from pymongo.errors import BulkWriteError

    try:
        collection.bulk_write(ops, ordered=False)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if exc.details.get("writeConcernErrors") or any(e.get("code") != DUPLICATE_KEY for e in errors):
            raise
        return UpsertResult(applied=len(ops) - len(errors), stale=len(errors))
    return UpsertResult(applied=len(ops))


def conditional_upsert(collection: Collection[Any], docs: Iterable[Mapping[str, Any]]) -> UpsertResult:
    """Write each state document unless the stored one has an equal or greater version.

    Unordered bulk writes in chunks; a duplicate-key error on `_id` means the stored document
    is not older (the version filter did not match, so the upsert tried to insert): counted as
    stale. Any other write error is raised.
    """
    result = UpsertResult()
    ops: list[Any] = []
    for doc in docs:
        ops.append(_conditional_update(doc))
        if len(ops) >= _MONGO_CHUNK:
            result += _flush(collection, ops)
            ops = []
    return result + _flush(collection, ops) if ops else result


_clients: dict[str, MongoClient[Any]] = {}
_clients_lock = threading.Lock()


def _client(uri: str) -> MongoClient[Any]:
    """One client per URI per Python worker process (workers are reused across tasks)."""
    from pymongo import MongoClient

    with _clients_lock:
        if uri not in _clients:
            _clients[uri] = MongoClient(uri, tz_aware=True, w="majority")
        return _clients[uri]


def _upsert_partition(uri: str, database: str, collection: str, rows: Iterator[Row]) -> None:
    coll = _client(uri)[database][collection]
    conditional_upsert(coll, (state_document(r.asDict()) for r in rows))


class MongoStateView:
    """The read model: state rows upserted into `database.collection`, version-conditioned.

    The writes run in the executors (`foreachPartition`), so the executors need `pymongo` and
    this package (true in local mode; on a cluster, ship them with the job).
    """

    def __init__(self, uri: str, database: str, collection: str) -> None:
        self.uri, self.database, self.collection = uri, database, collection

    def write(self, updates: DataFrame) -> None:
        from pyspark.sql import functions as F

        rows = updates.select(
            *[c for c in STATE_COLUMNS if c != "lastOccurredAt"],
            F.unix_millis("lastOccurredAt").alias("lastOccurredAtMs"),
        )
        rows.foreachPartition(functools.partial(_upsert_partition, self.uri, self.database, self.collection))

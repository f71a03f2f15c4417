"""Partitions of one outbox (RELAY_PARTITIONS): which events a partition holds and its lease id.
Pure: no I/O. (The change stream pipelines built on `Partition.change_match` are relay.mongo.pipeline's;
how replicas share the partitions, relay.group.balance.)

**The partition of an event** is computed by MongoDB in each partition's change stream, so
outboxes written by any service work unchanged:

    h = $toHashedIndexKey(aggregateId)   # MongoDB's hashed-index hash, a signed 64-bit integer
    k = h mod N                          # the non-negative remainder, 0 <= k < N (Python's h % N)

`h` is the hash of a hashed index (and of hashed sharding), so it cannot change between MongoDB
versions without breaking every hashed index on disk. For a string it is the first 8 bytes,
read as a little-endian signed integer, of MD5 over: the seed 0 (int32 LE), the canonical type
15 (int32 LE), the string's BSON value (int32 LE length including the NUL, the UTF-8 bytes, a
NUL). A null or missing `aggregateId` hashes as BSON null (canonical type 5, no value bytes):
such an event still falls in exactly one partition, where the relay stops on it as malformed
(or dead-letters it), as it does without partitions. `hashed_index_key` and `partition_of`
compute the same in Python (tests/integration/test_partitions.py checks them against the
server); consumers can use them to find the partition of a key. MongoDB's `$mod` keeps the
sign of the dividend, so a partition's predicate (`Partition.selection`) matches `h mod N` in {k, k - N}.

**Scopes and leases**: a relay loop publishes one `Scope`, the events of one outbox in one
partition of it (Partition(0, 1): all of them), under one lease. The unpartitioned outbox is
`Partition(0, 1)` everywhere; only what users see keeps the shape it always had, and `Scope`
answers for it in one place each (`partitioned` is the one test): its lease id (with N = 1 the
namespace `<db>.<collection>`; with N > 1 partition k has its own, `<db>.<collection>#<k>/<N>`,
with its own fencing token and checkpoint), its lease document's fields, its metric label values
(`label_names`) and its log fields; `Partition` answers which documents and change events it holds
(`selection`, `change_match`: the whole outbox's change stream keeps the pipeline, and so the
fingerprint, it always had). A stream that reads several scopes tells them apart by their index in
`scopes` (`route_of`), which the server computes for each insert (`route_expression`: with one
partition, no hash).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from relay.core.namespace import Namespace

MAX_PARTITIONS = 64

_SEED = struct.pack("<i", 0)
_STRING = struct.pack("<i", 15)  # BSON canonical type of strings (and symbols)
_NULL = struct.pack("<i", 5)  # BSON canonical type of null (and missing)


@dataclass(frozen=True, order=True)
class Partition:
    """Partition `index` of `count` (0 <= index < count)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"partition {self.index} of {self.count}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def selection(self, path: str) -> dict[str, Any] | None:
        """The query predicate (`$expr`) true for exactly the documents of this partition, their
        aggregate id at `path` (e.g. "$aggregateId"); None for WHOLE, which holds every document."""
        if self.count == 1:
            return None
        k, n = self.index, self.count
        return {"$expr": {"$in": [partition_expression(path, n), [k, k - n] if k else [0]]}}

    def change_match(self, operations: Sequence[str], path: str) -> dict[str, Any]:
        """The `$match` filter of this partition's change stream over the change events of
        `operations`, the aggregate id of an insert at `path` (e.g. "$fullDocument.aggregateId"):
        every one of them for WHOLE (the unpartitioned stream's filter, as it always was); for one
        partition, its own inserts (`selection`) and every other operation (those end the stream,
        so every partition sees them)."""
        watched = {"operationType": {"$in": operations}}
        own = self.selection(path)
        if own is None:
            return watched
        ending = [op for op in operations if op != "insert"]
        return {"$or": [{"operationType": {"$in": ending}}, {"operationType": "insert", **own}]}


WHOLE = Partition(0, 1)  # the unpartitioned outbox: every event


def partition_expression(path: str, count: int) -> dict[str, Any]:
    """The aggregation expression for `h mod N` of the field at `path` (e.g. "$fullDocument.aggregateId");
    its value lies in (-N, N) since MongoDB's $mod keeps the dividend's sign."""
    return {"$mod": [{"$toHashedIndexKey": path}, count]}


def partitions(count: int) -> list[Partition]:
    return [Partition(k, count) for k in range(count)]


@dataclass(frozen=True, order=True)
class Scope:
    """What one relay loop publishes and one lease guards: the events of the outbox `namespace`
    that fall in `partition`."""

    namespace: Namespace
    partition: Partition = WHOLE

    @property
    def database(self) -> str:
        return self.namespace.database

    @property
    def collection(self) -> str:
        return self.namespace.collection

    @property
    def partitioned(self) -> bool:
        """Whether the outbox is split (RELAY_PARTITIONS > 1). An unpartitioned outbox's lease id,
        lease document and metric labels keep the shape they had before partitions existed."""
        return self.partition.count > 1

    @property
    def lease_id(self) -> str:
        """The lease document's id: the namespace when the outbox is not partitioned."""
        if not self.partitioned:
            return str(self.namespace)
        return f"{self.namespace}#{self.partition.index}/{self.partition.count}"

    @property
    def lease_fields(self) -> dict[str, Any]:
        """The partition's fields of its lease document; none for the unpartitioned document."""
        p = self.partition
        return {"outbox": str(self.namespace), "partition": p.index, "partitions": p.count} if self.partitioned else {}

    @property
    def labels(self) -> tuple[str, ...]:
        """Its values of `label_names(partition.count)`: the outbox, and the partition when split."""
        outbox = str(self.namespace)
        return (outbox, str(self.partition.index)) if self.partitioned else (outbox,)

    @property
    def log_fields(self) -> dict[str, Any]:
        """The fields its loop's log lines carry: the outbox, and the partition when split."""
        return {"outbox": str(self.namespace), **({"partition": self.partition.index} if self.partitioned else {})}

    def __str__(self) -> str:
        return self.lease_id


def label_names(count: int) -> list[str]:
    """The labels of the series about one lease: `outbox`, and `partition` when RELAY_PARTITIONS > 1."""
    return ["outbox", "partition"] if count > 1 else ["outbox"]


def described(namespace: Namespace, count: int) -> str:
    """The outbox as a message names it: `shop.outbox`, or `shop.outbox (4 partitions)`."""
    return str(namespace) if count == 1 else f"{namespace} ({count} partitions)"


def scopes(namespaces: Sequence[Namespace], count: int) -> list[Scope]:
    """Every scope of the outboxes `namespaces` split into `count` partitions, outbox by outbox."""
    return [Scope(namespace, p) for namespace in namespaces for p in partitions(count)]


def route_of(outbox_index: int, partitions: int, partition: int) -> int:
    """The route of a scope in a stream that reads several (relay.mongo.pipeline.StreamPlan): its
    index in `scopes(outboxes, partitions)`, outbox index x N + partition. The one statement of the
    formula; `route_expression` has the server compute the same."""
    return outbox_index * partitions + partition


def route_expression(outbox: dict[str, Any] | int, path: str, count: int) -> dict[str, Any]:
    """`route_of` computed by the server for an insert, `$add: [$multiply: [outbox, N], partition]`:
    `outbox` is its outbox's index (an aggregation expression, or a number), its aggregate id is
    at `path`. With one partition the route is the outbox's index alone: nothing is hashed
    (`$toHashedIndexKey` needs MongoDB 6.0)."""
    if count == 1:
        return outbox if isinstance(outbox, dict) else {"$literal": outbox}
    partition = {"$mod": [{"$add": [partition_expression(path, count), count]}, count]}  # in [0, N)
    return {"$add": [{"$multiply": [outbox, count]}, partition]}


def hashed_index_key(value: str | None) -> int:
    """MongoDB's `$toHashedIndexKey` of a string (or of null / a missing field), in Python."""
    if value is None:
        data = _SEED + _NULL
    else:
        raw = value.encode("utf-8")
        data = _SEED + _STRING + struct.pack("<i", len(raw) + 1) + raw + b"\x00"
    return int(struct.unpack("<q", hashlib.md5(data).digest()[:8])[0])


def partition_of(aggregate_id: str | None, count: int) -> int:
    """The partition (0 <= k < count) whose change stream carries events with this aggregate id."""
    return hashed_index_key(aggregate_id) % count


# ---- lease ids ----------------------------------------------------------------------------------


def lease_id_pattern(namespace: Namespace) -> str:
    """A regular expression matching every lease id of `namespace`, whatever its partition count."""
    return f"^{re.escape(str(namespace))}(#[0-9]+/[0-9]+)?$"


def parse_lease_id(namespace: Namespace, value: str) -> Partition | None:
    """The partition a lease id names (WHOLE for the namespace itself); None if it is not a lease
    id of `namespace`."""
    if value == str(namespace):
        return WHOLE
    m = re.fullmatch(re.escape(str(namespace)) + r"#([0-9]+)/([0-9]+)", value)
    if m is None:
        return None
    try:
        return Partition(int(m.group(1)), int(m.group(2)))
    except ValueError:
        return None

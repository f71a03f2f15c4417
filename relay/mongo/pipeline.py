"""The change stream pipeline: which changes the relay reads, and the fingerprint stored beside
every token (a token is tied to its pipeline: resuming with another one could skip or repeat
events, so a mismatch stops the relay, relay.core.resume.resume).

Inserts are the events; the other watched types end the stream and must not pass unseen. The
projection keeps only what the relay reads (the resume token `_id` always stays), which makes each
change cheaper to transfer and decode. With RELAY_PARTITIONS > 1 each partition's stream keeps
only the inserts whose aggregate id hashes to it, computed by the server (relay.core.partitions).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from relay.core.partitions import Partition

WATCHED_OPERATIONS = ["insert", "drop", "rename", "dropDatabase", "invalidate"]
PIPELINE: list[dict[str, Any]] = [
    {"$match": {"operationType": {"$in": WATCHED_OPERATIONS}}},
    {"$project": {"operationType": 1, "clusterTime": 1, "wallTime": 1, "fullDocument": 1}},
]


def partition_expression(path: str, count: int) -> dict[str, Any]:
    """The aggregation expression for `h mod N` of the field at `path` (e.g. "$fullDocument.aggregateId");
    its value lies in (-N, N) since MongoDB's $mod keeps the dividend's sign."""
    return {"$mod": [{"$toHashedIndexKey": path}, count]}


def partition_predicate(partition: Partition, path: str) -> dict[str, Any]:
    """A query predicate (`$expr`) true for exactly the documents of `partition`."""
    k, n = partition.index, partition.count
    return {"$expr": {"$in": [partition_expression(path, n), [k, k - n] if k else [0]]}}


def pipeline(partition: Partition | None = None, aggregate_id_field: str = "aggregateId") -> list[dict[str, Any]]:
    """The change stream pipeline: PIPELINE for the whole outbox (RELAY_PARTITIONS=1, unchanged),
    or, for one partition, the same with inserts kept only when their aggregate id hashes to it.
    Every partition still sees the operations that end the stream, so each of them stops on a
    drop or rename."""
    if partition is None or partition.count == 1:
        return PIPELINE
    ending = [op for op in WATCHED_OPERATIONS if op != "insert"]
    own = {"operationType": "insert", **partition_predicate(partition, f"$fullDocument.{aggregate_id_field}")}
    return [{"$match": {"$or": [{"operationType": {"$in": ending}}, own]}}, *PIPELINE[1:]]


def scan_filter(partition: Partition | None, aggregate_id_field: str = "aggregateId") -> dict[str, Any] | None:
    """The documents of the outbox a rescan serves for `partition` (None: all of them)."""
    if partition is None or partition.count == 1:
        return None
    return partition_predicate(partition, f"${aggregate_id_field}")


def pipeline_fingerprint(namespace: str, stages: list[dict[str, Any]] = PIPELINE) -> str:
    """A short hash of what the stored token depends on: the namespace and the pipeline."""
    text = json.dumps({"ns": namespace, "pipeline": stages}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

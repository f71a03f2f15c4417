"""The change stream pipelines: what a scope's checkpoint refers to, and what a shared stream reads.

A scope's selection (`pipeline`, `scan_filter`): the inserts of its outbox whose aggregate id
hashes to its partition (relay.core.partitions). Its fingerprint (`pipeline_fingerprint`) is
stored beside every token of its lease: a token is tied to its selection (resuming another one
could skip or repeat events, so a mismatch stops the relay, relay.core.resume.resume). The
fingerprint of an unpartitioned outbox is what it always was.

A shared stream (`StreamPlan`, relay.mongo.shared_reader) reads the scopes of one database (or of the
cluster) with one cursor: a collection's stream when the database holds one outbox, else the
database's, filtered by collection with the cheap shape (`ns.coll $in`, not `ns $in [{db, coll}]`).
When it serves several scopes the server computes each insert's route in a field `r` (the scope's
index: outbox index times N plus partition), so nothing outside the server hashes an aggregate id.
Inserts are the events; the other watched types end a scope's stream and must not pass unseen.
The projection keeps only what the relay reads (the resume token `_id` always stays).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from relay.core.namespace import Namespace
from relay.core.partitions import Partition, Scope, route_expression, route_of

WATCHED_OPERATIONS = ["insert", "drop", "rename", "dropDatabase", "invalidate"]
PIPELINE: list[dict[str, Any]] = [
    {"$match": {"operationType": {"$in": WATCHED_OPERATIONS}}},
    {"$project": {"operationType": 1, "clusterTime": 1, "wallTime": 1, "fullDocument": 1}},
]


def pipeline(partition: Partition, aggregate_id_field: str = "aggregateId") -> list[dict[str, Any]]:
    """A scope's selection as a collection's change stream pipeline: PIPELINE's stages for the whole
    outbox, or, for one partition, the same with inserts kept only when their aggregate id hashes
    to it (`Partition.change_match`). Every partition still sees the operations that end the stream."""
    match = partition.change_match(WATCHED_OPERATIONS, f"$fullDocument.{aggregate_id_field}")
    return [{"$match": match}, *PIPELINE[1:]]


def scan_filter(partition: Partition, aggregate_id_field: str = "aggregateId") -> dict[str, Any] | None:
    """The documents of the outbox a rescan serves for `partition` (None: all of them)."""
    return partition.selection(f"${aggregate_id_field}")


def pipeline_fingerprint(namespace: Namespace, stages: list[dict[str, Any]] = PIPELINE) -> str:
    """A short hash of what the stored token depends on: the namespace (its `db.coll` text) and the
    pipeline."""
    text = json.dumps({"ns": str(namespace), "pipeline": stages}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(scope: Scope, aggregate_id_field: str) -> str:
    """The fingerprint of `scope`'s selection, stored beside its tokens."""
    return pipeline_fingerprint(scope.namespace, pipeline(scope.partition, aggregate_id_field))


WHOLE_DATABASE = ["dropDatabase", "invalidate"]  # end every scope of the stream (they carry no collection)
EVERY_ROUTE = -1  # what a dropDatabase or an invalidate ends: every route of the stream


@dataclass(frozen=True)
class StreamPlan:
    """One shared change stream: the outboxes it reads, their partition count, and whether it is a
    collection's, a database's (`database`), or the cluster's (None)."""

    outboxes: tuple[Namespace, ...]
    partitions: int
    database: str | None

    @property
    def collection(self) -> str | None:
        """The collection of a collection's stream (one outbox in its database), else None."""
        if self.database is not None and len(self.outboxes) == 1:
            return self.outboxes[0].collection
        return None

    @property
    def routed(self) -> bool:
        """Whether it serves several scopes (outboxes times partitions), so each insert carries its route."""
        return len(self.outboxes) * self.partitions > 1

    def route(self, scope: Scope) -> int:
        """The route the server computes for `scope`'s inserts (`r`); 0 when not routed."""
        return route_of(self.outboxes.index(scope.namespace), self.partitions, scope.partition.index)

    def routes_of(self, database: str | None, collection: str | None) -> list[int]:
        """The routes a drop, rename, dropDatabase or invalidate of `database.collection` ends
        ([EVERY_ROUTE]: all of them; a change with no collection ends its database's outboxes)."""
        if self.collection is not None:
            return [EVERY_ROUTE]  # the one outbox of a collection's stream
        if collection is None and (self.database is not None or database is None):
            return [EVERY_ROUTE]  # the database's stream ended
        return [
            route_of(i, self.partitions, k)
            for i, o in enumerate(self.outboxes)
            if o.database == database and collection in (None, o.collection)
            for k in range(self.partitions)
        ]

    def stages(self, aggregate_id_field: str) -> list[dict[str, Any]]:
        """The pipeline after `$changeStream`."""
        match: dict[str, Any] = {"operationType": {"$in": WATCHED_OPERATIONS}}
        if self.collection is None:
            colls = sorted({o.collection for o in self.outboxes})
            match = {**match, "$or": [{"ns.coll": {"$in": colls}}, {"operationType": {"$in": WHOLE_DATABASE}}]}
            if self.database is None:
                match["ns.db"] = {"$in": sorted({o.database for o in self.outboxes})}
        projection: dict[str, Any] = dict(PIPELINE[1]["$project"])
        if self.collection is None:
            projection["ns"] = 1
        if self.routed:
            projection["r"] = self._route_expression(f"$fullDocument.{aggregate_id_field}")
        return [{"$match": match}, {"$project": projection}]

    def _route_expression(self, path: str) -> dict[str, Any]:
        """`route_of` computed by the server for each insert (relay.core.partitions.route_expression)."""
        if self.database is None:
            name: Any = {"$concat": ["$ns.db", ".", "$ns.coll"]}
            outbox: Any = {"$indexOfArray": [[str(o) for o in self.outboxes], name]}
        elif len(self.outboxes) > 1:
            outbox = {"$indexOfArray": [[o.collection for o in self.outboxes], "$ns.coll"]}
        else:
            outbox = 0
        return route_expression(outbox, path, self.partitions)

"""Changing RELAY_PARTITIONS: refused while relays with another count hold leases; otherwise the
new partitions start where the old ones stopped.

`prepare()` runs in a relay process's start-up checks (relay.wiring), before any lease is tried:

1. If a lease document of this outbox with another partition count is held (an owner whose lease
   has not expired by the server's clock), it raises ConfigError naming RELAY_PARTITIONS (exit 2):
   two partition counts at once would publish one aggregate's events from two streams, out of
   order. Stop every relay of the old count first.
2. If lease documents of another count exist (none held), the outbox moves to this count, in one
   transaction (replicas starting together do it once):
   - the *previous* count is the other count whose documents hold the newest checkpoint;
   - every partition of the new count starts at the oldest checkpoint of the previous count (its
     cluster time, `startAtClusterTime`, used while the partition has no checkpoint of its own).
     Every event before that time was published by its old partition (each old checkpoint is at
     or after it), so nothing is lost; the events between the oldest and the newest old
     checkpoint, at most, are published again (duplicates with the same event ids). If a
     partition of the previous count has no checkpoint (never led), there is no such bound: the
     new partitions start at RELAY_START_AT instead (a warning says so);
   - the new documents' fencing tokens start above every old one, so a consumer that drops
     messages whose fencing token is lower than one it saw for the same key keeps working;
   - the old count's documents are removed.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from bson import Timestamp
from pymongo import ReadPreference
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern

from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.core.partitions import (
    Partition,
    Scope,
    lease_id_pattern,
    parse_lease_id,
    partition_expression,
    partitions,
)
from relay.mongo.lease import MAJORITY

log = logging.getLogger("relay")


def prepare(leases: Collection[Any], namespace: Namespace, count: int) -> str | None:
    """Refuse a change of partition count under held leases, else carry the checkpoints over (the
    module docstring); returns what was done, None when nothing was to do."""
    others = [d for d in _outbox_leases(leases, namespace) if _count(namespace, d) != count]
    if not others:
        return None
    _refuse_if_held(others, namespace, count)
    with leases.database.client.start_session() as session:
        message: str | None = session.with_transaction(
            lambda s: _move(leases, namespace, count, s),
            read_concern=ReadConcern("snapshot"),
            write_concern=MAJORITY,
            read_preference=ReadPreference.PRIMARY,
        )
    if message:
        log.warning("%s", message)
    return message


def check_server(outbox: Collection[Any], count: int) -> None:
    """ConfigError naming RELAY_PARTITIONS when MongoDB cannot compute an event's partition
    (`$toHashedIndexKey`, MongoDB 6.0 and later)."""
    if count == 1:
        return
    try:
        list(outbox.aggregate([{"$limit": 1}, {"$project": {"_id": 0, "k": partition_expression("$x", count)}}]))
    except OperationFailure as exc:
        raise ConfigError(
            env_name("partitions"),
            f"MongoDB cannot compute the partition of an event ({(exc.details and exc.details.get('errmsg')) or exc}); "
            "RELAY_PARTITIONS > 1 needs $toHashedIndexKey (MongoDB 6.0 or later)",
        ) from exc


def _outbox_leases(
    leases: Collection[Any], namespace: Namespace, session: ClientSession | None = None
) -> list[dict[str, Any]]:
    return list(
        leases.aggregate(
            [
                {"$match": {"_id": {"$regex": lease_id_pattern(namespace)}}},
                {"$addFields": {"serverTime": "$$NOW"}},
            ],
            session=session,
        )
    )


def _count(namespace: Namespace, doc: Mapping[str, Any]) -> int:
    p = parse_lease_id(namespace, str(doc["_id"]))
    assert p is not None, doc["_id"]
    return p.count


def _held(doc: Mapping[str, Any]) -> bool:
    expires = doc.get("expiresAt")
    return doc.get("owner") is not None and expires is not None and expires > doc["serverTime"]


def _refuse_if_held(others: list[dict[str, Any]], namespace: Namespace, count: int) -> None:
    held = [d for d in others if _held(d)]
    if held:
        counts = sorted({_count(namespace, d) for d in held})
        holders = ", ".join(f"{d['_id']} by {d['owner']}" for d in held[:4])
        raise ConfigError(
            env_name("partitions"),
            (
                f"{count}, but relays with RELAY_PARTITIONS={'/'.join(map(str, counts))} hold leases on {namespace} "
                f"({holders}{', ...' if len(held) > 4 else ''}); stop every relay of the old partition count "
                "first, then start the new ones (docs/partitions.md: changing the partition count)"
            ),
        )


def _move(leases: Collection[Any], namespace: Namespace, count: int, session: ClientSession) -> str | None:
    """Move the outbox's lease documents to `count` partitions in `session`'s transaction: each
    new partition starts at the oldest checkpoint of the previous count (when every old
    partition had one), fencing tokens continue above the old ones; None when nothing moved."""
    docs = _outbox_leases(leases, namespace, session)
    others = [d for d in docs if _count(namespace, d) != count]
    if not others:
        return None  # another replica of the new count moved it first
    _refuse_if_held(others, namespace, count)
    if any(_held(d) for d in docs if _count(namespace, d) == count):
        return None  # a relay of this count already runs: it moved the outbox when it started
    previous, old = _newest_count(namespace, others)
    times: list[Timestamp | None] = [d.get("tokenClusterTime") for d in old]
    seed = min(t for t in times if t is not None) if len(old) == previous and None not in times else None
    fencing = max(int(d.get("fencingToken") or 0) for d in docs)
    for p in partitions(count):
        leases.with_options(write_concern=MAJORITY).update_one(
            {"_id": Scope(namespace, p).lease_id},
            _new_lease(namespace, p, count, fencing, seed, previous),
            upsert=True,
            session=session,
        )
    leases.delete_many({"_id": {"$in": [d["_id"] for d in others]}}, session=session)
    if seed is None:
        missing = previous - sum(1 for t in times if t is not None)
        return (
            f"RELAY_PARTITIONS changed from {previous} to {count} on {namespace}: {missing} of the "
            f"{previous} old partitions had no checkpoint, so the new partitions start at RELAY_START_AT "
            f"(nothing bounds what the old ones published); old lease documents removed, fencing tokens "
            f"continue above {fencing}"
        )
    return (
        f"RELAY_PARTITIONS changed from {previous} to {count} on {namespace}: the new partitions start at "
        f"cluster time {seed.time}.{seed.inc}, the oldest checkpoint of the old ones (events after it "
        f"may be published again); old lease documents removed, fencing tokens continue above {fencing}"
    )


def _newest_count(namespace: Namespace, others: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """The partition count among `others` whose documents hold the newest checkpoint, and them."""
    by_count: dict[int, list[dict[str, Any]]] = {}
    for d in others:
        by_count.setdefault(_count(namespace, d), []).append(d)
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)

    def newest(c: int) -> dt.datetime:
        return max((_aware(d.get("checkpointAt")) or epoch for d in by_count[c]), default=epoch)

    previous = max(by_count, key=newest)
    return previous, by_count[previous]


def _new_lease(
    namespace: Namespace, p: Partition, count: int, fencing: int, seed: Timestamp | None, previous: int
) -> dict[str, Any]:
    """The upsert of partition `p`'s lease document: free, no checkpoint, fencing token at least
    `fencing`, starting at `seed` when there is one."""
    fields: dict[str, Any] = {"owner": None, "expiresAt": None, **Scope(namespace, p).lease_fields}
    update: dict[str, Any] = {
        "$setOnInsert": fields,
        "$max": {"fencingToken": fencing},
        "$unset": {"resumeToken": "", "tokenClusterTime": "", "pipelineFingerprint": ""},
    }
    if seed is not None:
        update["$set"] = {"startAtClusterTime": seed, "seededFrom": {"partitions": previous, "clusterTime": seed}}
    else:
        update["$unset"]["startAtClusterTime"] = ""
    return update


def _aware(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return None

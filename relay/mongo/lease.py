"""The lease, its fencing token, and the fenced checkpoint, in one MongoDB document per scope (an
outbox, or one partition of it with RELAY_PARTITIONS > 1: relay.core.partitions.Scope).

Design from the blog post in shared/reference (004): find-and-modify with upsert and majority
write concern takes or renews the lease; the fencing token (a version) grows by one whenever
the owner changes; the resume token lives in the same document. Expiry is computed from the
server's clock (`$$NOW`), never the relay's.

Invariants enforced here:
- `try_acquire` gives the lease to at most one owner at a time: findAndModify is atomic and
  matches only a lease that is free, expired (by the server's clock) or already ours.
- `store_checkpoint` and `renew` match only while (owner, fencing token) are still ours; a write
  with a stale fencing token matches nothing and raises LeaseLostError, so a paused replica can
  never move the checkpoint, forward or back.

What operators read and reset (`status`, `checkpoint reset`) is relay.mongo.lease_admin's.

Every lease document holds `acquiredAt` (server time of the last change of owner; set on the next
acquisition for a document written before it was kept for every lease). A partition's document
(`<db>.<collection>#<k>/<N>`) also holds `outbox`, `partition`, `partitions` and, after a change of
RELAY_PARTITIONS (relay.mongo.repartition), `startAtClusterTime`: where the partition starts while it
has no checkpoint of its own.
A document created for an outbox added to RELAY_OUTBOXES holds `rescan: true` until its first
checkpoint (relay.mongo.outboxes): it starts by publishing what the outbox already holds.
`cleanedUpBefore` records the outbox's clean-up (relay.mongo.housekeeping, `outbox prune`): null
from the document's creation, then the newest cutoff a clean-up pass deleted below (documents whose
occurredAt is before it may be gone), written before that pass deletes. A document created by an
earlier release, or by a change of RELAY_PARTITIONS, has none until its first clean-up: nothing is
known of its clean-up. `replay`'s gap check reads it (docs/replay.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson import Timestamp
from pymongo import ReturnDocument
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.write_concern import WriteConcern

from relay.core.errors import LeaseLostError
from relay.core.partitions import Scope
from relay.core.positions import Checkpoint, ClusterTime, Grant, token_cluster_time

MAJORITY = WriteConcern("majority")
CLEANED_UP_BEFORE = "cleanedUpBefore"  # the clean-up's record (module docstring)


class LeaseStore:
    """The lease document of one scope (its `_id` is `scope.lease_id`: the outbox's namespace, or
    `<namespace>#<k>/<N>` for a partition of it).

    `lease_id` is the identity of whatever this lease guards (the exactly-once mode names its
    transactional producer and offsets after it).
    """

    def __init__(
        self, collection: Collection[Any], scope: Scope, owner: str, ttl_s: float, delivery: str = "at-least-once"
    ) -> None:
        self._coll = collection.with_options(write_concern=MAJORITY)
        self.scope = scope
        self.lease_id = scope.lease_id
        self.owner = owner
        self.delivery = delivery  # RELAY_DELIVERY, stored beside every checkpoint
        self._ttl_ms = int(ttl_s * 1000)
        self._ensured = False
        self._fields = scope.lease_fields  # none for the unpartitioned document, which stays as it was

    def _expires(self) -> dict[str, Any]:
        return {"$add": ["$$NOW", self._ttl_ms]}

    def ensure(self, rescan: bool = False) -> bool:
        """Create the lease document if it does not exist (idempotent); `rescan` marks a new one
        to start by publishing what its outbox holds. True when it was created now."""
        # A find-and-modify that compares with $$NOW needs $expr, which an upsert refuses, so
        # the document is created first (idempotently) and then only ever updated.
        created = False
        if not self._ensured:
            new = {"owner": None, "fencingToken": 0, "expiresAt": None, CLEANED_UP_BEFORE: None, **self._fields}
            if rescan:
                new["rescan"] = True
            result = self._coll.update_one({"_id": self.lease_id}, {"$setOnInsert": new}, upsert=True)
            created = result.upserted_id is not None
            self._ensured = True
        return created

    def exists(self) -> bool:
        """Whether the lease document exists."""
        return self._coll.count_documents({"_id": self.lease_id}, limit=1) > 0

    def try_acquire(self) -> Grant | None:
        """Take the lease if it is free, expired or already ours; renew it if ours.

        Returns None while another owner holds an unexpired lease. The fencing token grows by
        one on every change of owner and stays the same on renewal.
        """
        self.ensure()
        me = self.owner
        # Free, expired or ours, by the server's clock ($lte is also true for a missing or null expiresAt).
        free_or_mine = {"$expr": {"$or": [{"$eq": ["$owner", me]}, {"$lte": ["$expiresAt", "$$NOW"]}]}}
        update = [
            {
                "$set": {
                    "fencingToken": {
                        "$cond": [
                            {"$eq": ["$owner", me]},
                            "$fencingToken",
                            {"$add": [{"$ifNull": ["$fencingToken", 0]}, 1]},
                        ]
                    },
                    "owner": me,
                    "expiresAt": self._expires(),
                    "renewedAt": "$$NOW",
                }
            }
        ]
        # When the lease changed hands (takeovers, balancing): `status` shows it for every lease.
        update[0]["$set"]["acquiredAt"] = {
            "$cond": [{"$and": [{"$eq": ["$owner", me]}, "$acquiredAt"]}, "$acquiredAt", "$$NOW"]
        }
        doc = self._coll.find_one_and_update(
            {"_id": self.lease_id, **free_or_mine},
            update,
            return_document=ReturnDocument.AFTER,
        )
        return None if doc is None else _grant(doc)

    def renew(self, grant: Grant) -> None:
        """Extend the lease; raises LeaseLostError if it is no longer ours."""
        self._fenced_update(grant, {"expiresAt": self._expires(), "renewedAt": "$$NOW"})

    def store_checkpoint(
        self, grant: Grant, token: Mapping[str, Any], fingerprint: str, session: ClientSession | None = None
    ) -> None:
        """Store the checkpoint and renew the lease in one fenced, majority-acknowledged write
        (inside `session`'s transaction when given: relay.mongo.checkpoints).

        Called only once every event up to `token` has been acknowledged by Kafka. A write
        with a stale fencing token matches nothing and raises LeaseLostError.
        """
        self._fenced_update(
            grant,
            {
                "resumeToken": {"$literal": dict(token)},
                "tokenClusterTime": {"$literal": _timestamp(token_cluster_time(token))},
                "pipelineFingerprint": fingerprint,
                "delivery": self.delivery,
                "checkpointAt": "$$NOW",
                "expiresAt": self._expires(),
                "renewedAt": "$$NOW",
                "rescan": "$$REMOVE",  # an added outbox's scan is done once a checkpoint is stored
            },
            session,
        )

    def release(self, grant: Grant) -> None:
        """Give the lease up (graceful stop) so a standby can take it at once."""
        self._coll.update_one(
            {"_id": self.lease_id, "owner": grant.owner, "fencingToken": grant.fencing_token},
            [{"$set": {"owner": None, "expiresAt": "$$NOW", "releasedAt": "$$NOW"}}],
        )

    def _fenced_update(self, grant: Grant, fields: dict[str, Any], session: ClientSession | None = None) -> None:
        result = self._coll.update_one(
            {"_id": self.lease_id, "owner": grant.owner, "fencingToken": grant.fencing_token},
            [{"$set": fields}],
            session=session,
        )
        if result.matched_count == 0:
            raise LeaseLostError(
                f"lease on {self.lease_id} lost: fencing token {grant.fencing_token} of "
                f"{grant.owner} is no longer current"
            )


def _timestamp(time: ClusterTime | None) -> Timestamp | None:
    return None if time is None else Timestamp(time.time, time.inc)


def cluster_time(value: Any) -> ClusterTime | None:
    """A stored BSON Timestamp as a ClusterTime (None if absent)."""
    return ClusterTime(value.time, value.inc) if isinstance(value, Timestamp) else None


def _grant(doc: Mapping[str, Any]) -> Grant:
    return Grant(
        owner=doc["owner"],
        fencing_token=int(doc["fencingToken"]),
        expires_at=doc["expiresAt"],
        checkpoint=Checkpoint(
            doc.get("resumeToken"),
            cluster_time(doc.get("tokenClusterTime")),
            doc.get("pipelineFingerprint"),
            doc.get("delivery"),
            cluster_time(doc.get("startAtClusterTime")),
            bool(doc.get("rescan")),
        ),
    )

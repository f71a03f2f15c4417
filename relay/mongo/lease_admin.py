"""The operator's side of a lease document (`outbox-relay status`, `checkpoint reset`): read it
with the server's time, forget the checkpoint. (Which replicas are alive is the group's
membership, relay.mongo.membership.)

The running relay's side (take, renew, store the checkpoint, release) is relay.mongo.lease.LeaseStore's; both
work on the same document (its `_id` is the lease id, relay.core.partitions.Scope.lease_id).
"""

from __future__ import annotations

from typing import Any

from pymongo.collection import Collection

from relay.mongo.lease import MAJORITY

# What `checkpoint reset` forgets: the stored checkpoint, and where a new partition count starts.
_CHECKPOINT_FIELDS = ("resumeToken", "tokenClusterTime", "pipelineFingerprint", "delivery", "startAtClusterTime")


class LeaseDocument:
    """One lease document as operators see it: `collection` holds it under `lease_id`."""

    def __init__(self, collection: Collection[Any], lease_id: str) -> None:
        self._coll = collection.with_options(write_concern=MAJORITY)
        self.lease_id = lease_id

    def read(self) -> dict[str, Any] | None:
        """The lease document as stored, with the server's current time (for `status`)."""
        docs = list(
            self._coll.aggregate(
                [
                    {"$match": {"_id": self.lease_id}},
                    {"$addFields": {"serverTime": "$$NOW"}},
                ]
            )
        )
        return docs[0] if docs else None

    def reset_checkpoint(self, force: bool = False) -> str | None:
        """Forget the stored token (operator action); the next leader starts at RELAY_START_AT.

        Only while no owner holds an unexpired lease (by the server's clock), in one conditional
        write; returns the holder and changes nothing otherwise. With `force` the token is
        forgotten anyway and the holder fenced out: the fencing token grows and the lease is
        freed, so the holder's next fenced write fails. Returns the holder (None if none).
        """
        forget = {"$unset": {name: "" for name in _CHECKPOINT_FIELDS}}
        free = {"$expr": {"$or": [{"$eq": [{"$ifNull": ["$owner", None]}, None]}, {"$lte": ["$expiresAt", "$$NOW"]}]}}
        if self._coll.update_one({"_id": self.lease_id, **free}, forget).matched_count:
            return None
        holder = (self._coll.find_one({"_id": self.lease_id}) or {}).get("owner")
        if force:
            self._coll.update_one(
                {"_id": self.lease_id},
                [
                    {"$unset": list(_CHECKPOINT_FIELDS)},
                    {
                        "$set": {
                            "owner": None,
                            "expiresAt": "$$NOW",
                            "releasedAt": "$$NOW",
                            "fencingToken": {"$add": [{"$ifNull": ["$fencingToken", 0]}, 1]},
                        }
                    },
                ],
            )
        return str(holder) if holder is not None else None

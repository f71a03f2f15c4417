"""The replicas of one outbox (a group of one partition without RELAY_PARTITIONS): heartbeats,
and who is live.

Each replica of a group keeps one document in the `<lease collection>_replicas` collection,
`_id` = `<db>.<collection>#group/<instance>`, with `outbox`, `instance`, `partitions` (its
partition count), `leading` (the partitions it leads), `role` (`leader` while it leads any,
`standby`, or `stopped` after a graceful stop), `seenAt` (server time of its last heartbeat)
and `joinedAt` (server time it joined: its first heartbeat, or the first after a stop or an
absence). A replica is live while it is not stopped and was seen within RELAY_LEASE_TTL_S by the
server's clock: a crashed replica stops counting when its leases expire, so the survivors' shares
grow just as its partitions become free.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from relay.core.errors import ServerError
from relay.mongo.errors import describe


class Membership:
    """This replica's heartbeat in its group, and the group's live replicas."""

    def __init__(
        self, lease_collection: Collection[Any], namespace: str, owner: str, partitions: int, ttl_s: float
    ) -> None:
        self._coll = lease_collection.database[f"{lease_collection.name}_replicas"]
        self.namespace = namespace
        self.owner = owner
        self.partitions = partitions
        self._ttl_ms = int(ttl_s * 1000)
        self._id = f"{namespace}#group/{owner}"

    def _recent(self) -> dict[str, Any]:
        return {"$gte": ["$seenAt", {"$subtract": ["$$NOW", self._ttl_ms]}]}

    def heartbeat(self, leading: Sequence[int]) -> list[str]:
        """Record that this replica is alive and leads `leading`; return the live replicas'
        instance ids (this one included). Raises ServerError when MongoDB does not answer."""
        present = {"$and": [{"$ne": ["$role", "stopped"]}, self._recent()]}
        try:
            self._coll.update_one(
                {"_id": self._id},
                [
                    {
                        "$set": {
                            "outbox": self.namespace,
                            "instance": self.owner,
                            "partitions": self.partitions,
                            "leading": sorted(leading),
                            "role": "leader" if leading else "standby",
                            "joinedAt": {"$cond": [present, "$joinedAt", "$$NOW"]},
                            "seenAt": "$$NOW",
                        }
                    }
                ],
                upsert=True,
            )
            return self.live()
        except PyMongoError as exc:
            raise ServerError(f"group heartbeat failed: {describe(exc)}") from exc

    def live(self) -> list[str]:
        """Instance ids of the live replicas with this partition count, sorted."""
        docs = self._coll.find(
            {
                "outbox": self.namespace,
                "partitions": self.partitions,
                "role": {"$ne": "stopped"},
                "$expr": self._recent(),
            },
            projection={"instance": 1},
        )
        return sorted(str(d["instance"]) for d in docs)

    def leave(self) -> None:
        """Mark this replica stopped (graceful stop), so the others take its share at once.
        Best effort: otherwise it stops counting after RELAY_LEASE_TTL_S."""
        with contextlib.suppress(PyMongoError):
            self._coll.update_one({"_id": self._id}, [{"$set": {"role": "stopped", "leading": [], "leftAt": "$$NOW"}}])

    def replicas(self) -> list[dict[str, Any]]:
        """Every replica of this group as stored, with the server's time (for `status`)."""
        return list(
            self._coll.aggregate(
                [
                    {"$match": {"outbox": self.namespace, "partitions": self.partitions}},
                    {"$addFields": {"serverTime": "$$NOW"}},
                    {"$sort": {"instance": 1}},
                ]
            )
        )

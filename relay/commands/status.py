"""`outbox-relay status` and `checkpoint reset`: read (or reset) the lease documents.

With RELAY_PARTITIONS=1 there is one lease document (the output is as it always was); with
N > 1 `status` lists every partition (holder, fencing token, expiry, checkpoint and its lag) and
every replica of the group with the partitions it leads, and `checkpoint reset` resets them all.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from relay.config import Settings
from relay.core.errors import LeaseHeldError
from relay.core.partitions import Partition, partitions
from relay.core.positions import short_token, token_cluster_time
from relay.mongo.connection import check_mongodb, mongo_client
from relay.mongo.lease_admin import LeaseDocument
from relay.mongo.membership import Membership


def _lease_store(settings: Settings, client: Any, partition: Partition | None = None) -> LeaseDocument:
    return settings.parts().lease_document(client, partition)


def _stores(settings: Settings, client: Any) -> list[LeaseDocument]:
    if settings.partitions == 1:
        return [_lease_store(settings, client)]
    return [_lease_store(settings, client, p) for p in partitions(settings.partitions)]


def status(settings: Settings) -> dict[str, Any]:
    """The lease holder, fencing token, expiry, and the checkpoint with its lag (per partition
    with RELAY_PARTITIONS > 1)."""
    mongo = settings.parts().mongo
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)
        if settings.partitions > 1:
            return _group_status(settings, client)
        store = _lease_store(settings, client)
        doc = store.read()
        replicas = store.replicas()
    out: dict[str, Any] = {"outbox": settings.namespace, "lease": None, "checkpoint": None, "replicas": []}
    if doc is None:
        return out
    now: dt.datetime = doc["serverTime"]
    stale_after = 3 * max(settings.heartbeat_interval_s, settings.standby_poll_s)
    for r in replicas:
        age = (now - r["seenAt"]).total_seconds()
        holds = r["instance"] == doc.get("owner") and doc.get("expiresAt") is not None and doc["expiresAt"] > now
        out["replicas"].append(
            {
                "instance": r["instance"],
                "role": "leader" if holds else ("gone" if age > stale_after else "standby"),
                "lastSeenSecondsAgo": round(age, 1),
            }
        )
    out["lease"] = _lease(doc, now)
    out["checkpoint"] = _checkpoint(doc, now)
    return out


def _lease(doc: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    expires = doc.get("expiresAt")
    return {
        "owner": doc.get("owner"),
        "fencingToken": doc.get("fencingToken"),
        "expiresAt": expires,
        "expired": expires is None or expires <= now,
    }


def _checkpoint(doc: dict[str, Any], now: dt.datetime) -> dict[str, Any] | None:
    token = doc.get("resumeToken")
    if token is None:
        return None
    ts = token_cluster_time(token)
    at = dt.datetime.fromtimestamp(ts.time, dt.UTC) if ts else None
    return {
        "token": short_token(token),
        "clusterTime": at.isoformat() if at else None,
        "lagSeconds": round((now - at).total_seconds(), 3) if at else None,
        "storedAt": doc.get("checkpointAt"),
        "pipelineFingerprint": doc.get("pipelineFingerprint"),
        "delivery": doc.get("delivery"),
    }


def _group_status(settings: Settings, client: Any) -> dict[str, Any]:
    db = client[settings.database]
    membership = Membership(
        db[settings.lease_collection],
        settings.namespace,
        settings.instance_id,
        settings.partitions,
        settings.lease_ttl_s,
    )
    rows: list[dict[str, Any]] = []
    holders: dict[str, list[int]] = {}
    now: dt.datetime | None = None
    for store, p in zip(_stores(settings, client), partitions(settings.partitions), strict=False):
        doc = store.read()
        row: dict[str, Any] = {"partition": p.index, "leaseId": store.lease_id, "lease": None, "checkpoint": None}
        if doc is not None:
            now = doc["serverTime"]
            row["lease"] = {**_lease(doc, now), "acquiredAt": doc.get("acquiredAt")}
            row["checkpoint"] = _checkpoint(doc, now)
            if doc.get("startAtClusterTime") is not None and row["checkpoint"] is None:
                seed = doc["startAtClusterTime"]
                row["startsAt"] = dt.datetime.fromtimestamp(seed.time, dt.UTC).isoformat()
            if not row["lease"]["expired"] and doc.get("owner") is not None:
                holders.setdefault(str(doc["owner"]), []).append(p.index)
        rows.append(row)
    replicas = []
    for r in membership.replicas():
        age = (r["serverTime"] - r["seenAt"]).total_seconds()
        leading = holders.get(str(r["instance"]), [])
        role = (
            "stopped"
            if r.get("role") == "stopped"
            else "leader"
            if leading
            else "gone"
            if age > settings.lease_ttl_s
            else "standby"
        )
        replicas.append(
            {
                "instance": r["instance"],
                "role": role,
                "leading": leading,
                "lastSeenSecondsAgo": round(age, 1),
                "joinedAt": r.get("joinedAt"),
            }
        )
    return {
        "outbox": settings.namespace,
        "partitions": settings.partitions,
        "partitionsLed": sum(len(v) for v in holders.values()),
        "leases": rows,
        "replicas": replicas,
    }


def reset_checkpoint(settings: Settings, force: bool = False) -> str:
    """Forget the stored checkpoint (every partition's, with RELAY_PARTITIONS > 1); the next
    leader starts at RELAY_START_AT.

    Refused (LeaseHeldError, naming the holder) while a leader holds an unexpired lease: its next
    commit would store its position again, so the reset would silently do nothing. With `force`
    the holder is also fenced out (the fencing token grows and the lease is freed), so its next
    write fails and it goes back to standby before taking the lease again.
    """
    mongo = settings.parts().mongo
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)
        stores = _stores(settings, client)
        if not force:
            held = [(s.lease_id, (s.read() or {})) for s in stores]
            busy = [
                (lid, d)
                for lid, d in held
                if d.get("owner") is not None and d.get("expiresAt") is not None and d["expiresAt"] > d["serverTime"]
            ]
            if busy:
                lid, doc = busy[0]
                what = settings.namespace if settings.partitions == 1 else lid
                raise LeaseHeldError(
                    f"{doc['owner']} holds the lease on {what}: it would store its position again at "
                    "its next commit. Stop the relays first, or use --force to fence it out as well"
                )
        fenced = [h for h in (s.reset_checkpoint(force) for s in stores) if h is not None]
    if fenced and not force:
        raise LeaseHeldError(
            f"{fenced[0]} holds the lease on {settings.namespace}: it would store its position again at "
            "its next commit. Stop the relays first, or use --force to fence it out as well"
        )
    which = (
        settings.namespace if settings.partitions == 1 else f"{settings.namespace} ({settings.partitions} partitions)"
    )
    note = f" ({', '.join(sorted(set(fenced)))} fenced out)" if fenced else ""
    return f"checkpoint for {which} removed{note}; the next start begins at RELAY_START_AT={settings.start_at}"

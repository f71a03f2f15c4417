"""`outbox-relay status` and `checkpoint reset`: read (or reset) the lease document."""

from __future__ import annotations

import datetime as dt
from typing import Any

from relay.changes import short_token, token_cluster_time
from relay.config import Settings
from relay.errors import LeaseHeldError
from relay.lease import LeaseStore
from relay.connections import check_mongodb, mongo_client


def _lease_store(settings: Settings, client: Any) -> LeaseStore:
    db = client[settings.database]
    return LeaseStore(db[settings.lease_collection], settings.namespace, settings.instance_id,
                      settings.lease_ttl_s)


def status(settings: Settings) -> dict[str, Any]:
    """The lease holder, fencing token, expiry, and the checkpoint with its lag."""
    with mongo_client(settings) as client:
        check_mongodb(client, settings)
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
        out["replicas"].append({"instance": r["instance"], "role": "leader" if holds else
                                ("gone" if age > stale_after else "standby"),
                                "lastSeenSecondsAgo": round(age, 1)})
    expires = doc.get("expiresAt")
    out["lease"] = {
        "owner": doc.get("owner"),
        "fencingToken": doc.get("fencingToken"),
        "expiresAt": expires,
        "expired": expires is None or expires <= now,
    }
    token = doc.get("resumeToken")
    if token is not None:
        ts = token_cluster_time(token)
        at = dt.datetime.fromtimestamp(ts.time, dt.timezone.utc) if ts else None
        out["checkpoint"] = {
            "token": short_token(token),
            "clusterTime": at.isoformat() if at else None,
            "lagSeconds": round((now - at).total_seconds(), 3) if at else None,
            "storedAt": doc.get("checkpointAt"),
            "pipelineFingerprint": doc.get("pipelineFingerprint"),
            "delivery": doc.get("delivery"),
        }
    return out


def reset_checkpoint(settings: Settings, force: bool = False) -> str:
    """Forget the stored checkpoint; the next leader starts at RELAY_START_AT.

    Refused (LeaseHeldError, naming the holder) while a leader holds an unexpired lease: its next
    commit would store its position again, so the reset would silently do nothing. With `force`
    the holder is also fenced out (the fencing token grows and the lease is freed), so its next
    write fails and it goes back to standby before taking the lease again.
    """
    with mongo_client(settings) as client:
        check_mongodb(client, settings)
        holder = _lease_store(settings, client).reset_checkpoint(force)
    if holder is not None and not force:
        raise LeaseHeldError(
            f"{holder} holds the lease on {settings.namespace}: it would store its position again at "
            "its next commit. Stop the relays first, or use --force to fence it out as well")
    fenced = f" ({holder} fenced out)" if holder is not None else ""
    return (f"checkpoint for {settings.namespace} removed{fenced}; the next start begins at "
            f"RELAY_START_AT={settings.start_at}")

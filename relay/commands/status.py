"""`outbox-relay status` and `checkpoint reset`: read (or reset) the lease documents.

`status` lists, for each outbox (`--outbox`: one of them), every partition (holder, fencing token,
expiry, checkpoint, its lag and how long ago it was stored; one, the whole outbox's, without RELAY_PARTITIONS, also shown at
the top as it always was) and every replica of the group with what it leads: partition indexes
when one outbox is shown, lease ids when several are. With several outboxes and no `--outbox` they
are listed under `outboxes`. `checkpointIntervalMs` is RELAY_CHECKPOINT_INTERVAL_MS: checkpoints are
stored at most that often, so after a crash the events of about that long (plus what was in flight)
are published again (`duplicateWindow`). `sharedTopics` lists the outboxes the topic template routes
to the same topics (an aggregate type two of them use lands on one topic: relay.avro.shared_topics).
`broker` names where events are published (RELAY_BROKER) and its address: Kafka's bootstrap
servers, NATS's servers and the JetStream stream, or RabbitMQ's URL and exchange (credentials
masked).
Every time is RFC 3339 in UTC with milliseconds (`2026-11-27T10:00:00.000Z`: relay.core.times).
`checkpoint reset` resets one
outbox's leases (every partition's), named with `--outbox` when there are several.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from relay.avro.shared_topics import shared_topics
from relay.config import Settings
from relay.core.errors import LeaseHeldError
from relay.core.namespace import Namespace
from relay.core.partitions import Partition, Scope, described, partitions
from relay.core.positions import short_token, token_cluster_time
from relay.core.times import rfc3339
from relay.group.config import group_name
from relay.mongo.connection import check_mongodb, mongo_client
from relay.mongo.lease_admin import LeaseDocument
from relay.mongo.membership import Membership


def _stores(settings: Settings, client: Any, namespace: Namespace) -> list[LeaseDocument]:
    """Every partition's lease document of the outbox `namespace` (the whole outbox's without partitions)."""
    leases = settings.parts().mongo.leases(client)
    return [LeaseDocument(leases, Scope(namespace, p).lease_id) for p in partitions(settings.partitions)]


def broker_of(settings: Settings) -> dict[str, Any]:
    """Where the relay publishes, as `status` shows it (credentials masked)."""
    parts = settings.parts()
    if parts.broker == "nats":
        return {"name": "nats", "servers": str(parts.nats.servers), "stream": parts.nats.stream}
    if parts.broker == "rabbitmq":
        return {"name": "rabbitmq", "url": str(parts.rabbitmq.url), "exchange": parts.rabbitmq.exchange}
    return {"name": "kafka", "bootstrapServers": str(parts.kafka.bootstrap_servers)}


def status(settings: Settings, outbox: str | None = None) -> dict[str, Any]:
    """Each outbox's leases (holder, fencing token, expiry), checkpoints and their lag, and every
    replica with the leases it leads (the module docstring); `outbox` picks one."""
    parts = settings.parts()
    mongo, group = parts.mongo, parts.group
    chosen = settings.pick_outboxes(outbox)
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)
        shown = {n: [(s, s.read()) for s in _stores(settings, client, n)] for n in chosen}
        membership = Membership(
            mongo.leases(client),
            group_name(parts.outboxes),
            group.instance_id,
            group.partitions,
            group.timing.lease_ttl_s,
        )
        members = membership.replicas()
    holders: dict[str, list[dict[str, Any]]] = {}
    outboxes = {str(n): _outbox_status(n, docs, group.partitions, holders) for n, docs in shown.items()}
    interval, count = settings.checkpoint_interval_ms, settings.checkpoint_max_events
    common = {
        "broker": broker_of(settings),
        "checkpointIntervalMs": interval,
        "checkpointMaxEvents": count,
        "duplicateWindow": (
            f"after a crash, the events delivered in its last {interval / 1000:g} s (at most {count:,} of them) "
            "and those in flight are published again"
            if interval
            else "after a crash, the events in flight are published again (checkpoints stored after every batch)"
        ),
        "sharedTopics": [s.as_status() for s in shared_topics(settings.topic_template, parts.outboxes)],
        "partitions": group.partitions,
        "partitionsLed": sum(len(v) for v in holders.values()),
        "replicas": [_replica(r, holders, group.timing.lease_ttl_s, len(outboxes) == 1) for r in members],
    }
    if len(outboxes) == 1:
        [(namespace, one)] = outboxes.items()
        return {
            "outbox": namespace,
            **{k: v for k, v in one.items() if k != "leases"},
            **common,
            "leases": one["leases"],
        }
    return {"outboxes": outboxes, **common}


def _outbox_status(
    namespace: Namespace,
    docs: list[tuple[LeaseDocument, dict[str, Any] | None]],
    count: int,
    holders: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """One outbox's leases; adds each held lease's row to `holders` under its owner."""
    rows = [_partition_row(p, store.lease_id, doc) for p, (store, doc) in zip(partitions(count), docs, strict=True)]
    for row in rows:
        lease = row["lease"]
        if lease is not None and not lease["expired"] and lease["owner"] is not None:
            holders.setdefault(str(lease["owner"]), []).append(row)
    # The whole outbox's one lease is also shown at the top, as it always was.
    whole = {"lease": rows[0]["lease"], "checkpoint": rows[0]["checkpoint"]} if len(rows) == 1 else {}
    return whole | {"leases": rows}


def _partition_row(p: Partition, lid: str, doc: dict[str, Any] | None) -> dict[str, Any]:
    """One partition's lease and checkpoint as `status` shows them (None before its first start)."""
    row: dict[str, Any] = {"partition": p.index, "leaseId": lid, "lease": None, "checkpoint": None}
    if doc is None:
        return row
    now = doc["serverTime"]
    row["lease"] = _lease(doc, now)
    row["checkpoint"] = _checkpoint(doc, now)
    if doc.get("startAtClusterTime") is not None and row["checkpoint"] is None:
        row["startsAt"] = rfc3339(dt.datetime.fromtimestamp(doc["startAtClusterTime"].time, dt.UTC))
    return row


def _replica(r: dict[str, Any], holders: dict[str, list[dict[str, Any]]], ttl_s: float, one: bool) -> dict[str, Any]:
    """One replica as `status` shows it: `stopped` after a graceful stop, `leader` while it holds
    an unexpired lease, `gone` once unseen for RELAY_LEASE_TTL_S, else `standby`. `leading` lists
    the partitions it leads with one outbox shown (`one`), the lease ids with several."""
    age = (r["serverTime"] - r["seenAt"]).total_seconds()
    leading = [row["partition"] if one else row["leaseId"] for row in holders.get(str(r["instance"]), [])]
    if r.get("role") == "stopped":
        role = "stopped"
    elif leading:
        role = "leader"
    else:
        role = "gone" if age > ttl_s else "standby"
    return {
        "instance": r["instance"],
        "role": role,
        "leading": leading,
        "lastSeenSecondsAgo": round(age, 1),
        "joinedAt": _time(r.get("joinedAt")),
    }


def _lease(doc: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    expires = doc.get("expiresAt")
    return {
        "owner": doc.get("owner"),
        "fencingToken": doc.get("fencingToken"),
        "expiresAt": _time(expires),
        "expired": expires is None or expires <= now,
        "acquiredAt": _time(doc.get("acquiredAt")),
    }


def _checkpoint(doc: dict[str, Any], now: dt.datetime) -> dict[str, Any] | None:
    token = doc.get("resumeToken")
    if token is None:
        return None
    stored = doc.get("checkpointAt")
    ts = token_cluster_time(token)
    at = dt.datetime.fromtimestamp(ts.time, dt.UTC) if ts else None
    return {
        "token": short_token(token),
        "clusterTime": _time(at),
        "lagSeconds": round((now - at).total_seconds(), 3) if at else None,
        "storedAt": _time(stored),
        "storedSecondsAgo": round((now - stored).total_seconds(), 1) if stored is not None else None,
        "pipelineFingerprint": doc.get("pipelineFingerprint"),
        "delivery": doc.get("delivery"),
    }


def _time(value: Any) -> str | None:
    """A stored time as `status` shows it (relay.core.times.rfc3339); None when there is none."""
    return rfc3339(value) if isinstance(value, dt.datetime) else None


def reset_checkpoint(settings: Settings, force: bool = False, outbox: str | None = None) -> str:
    """Forget the stored checkpoint of an outbox (`outbox`; the only one when there is one), every
    partition's with RELAY_PARTITIONS > 1; the next leader starts at RELAY_START_AT.

    Refused (LeaseHeldError, naming the holder) while a leader holds an unexpired lease: its next
    write would store its checkpoint again, so the reset would silently do nothing. With `force`
    the holder is also fenced out (the fencing token grows and the lease is freed), so its next
    write fails and it goes back to standby before taking the lease again.
    """
    mongo = settings.parts().mongo
    [namespace] = settings.pick_outboxes(outbox, every=False)
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)
        stores = _stores(settings, client, namespace)
        if not force:
            held = [(s.lease_id, (s.read() or {})) for s in stores]
            busy = [
                (lid, d)
                for lid, d in held
                if d.get("owner") is not None and d.get("expiresAt") is not None and d["expiresAt"] > d["serverTime"]
            ]
            if busy:
                lid, doc = busy[0]
                what = lid
                raise LeaseHeldError(
                    f"{doc['owner']} holds the lease on {what}: it would store its checkpoint again at "
                    "its next write. Stop the relays first, or use --force to fence it out as well"
                )
        fenced = [h for h in (s.reset_checkpoint(force) for s in stores) if h is not None]
    if fenced and not force:
        raise LeaseHeldError(
            f"{fenced[0]} holds the lease on {namespace}: it would store its checkpoint again at "
            "its next write. Stop the relays first, or use --force to fence it out as well"
        )
    which = described(namespace, settings.partitions)
    note = f" ({', '.join(sorted(set(fenced)))} fenced out)" if fenced else ""
    return f"checkpoint for {which} removed{note}; the next start begins at RELAY_START_AT={settings.start_at}"

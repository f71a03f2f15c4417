"""`outbox-relay outbox init` and `outbox prune`: create the outbox collection and its index;
delete what the stored checkpoint covers."""

from __future__ import annotations

from relay.config import Settings
from relay.core.namespace import Namespace
from relay.mongo.connection import check_mongodb, mongo_client
from relay.mongo.housekeeping import CheckpointUnknownError, cleaner_for, shares_of
from relay.outbox import Outbox

TTL_WARNING = (
    "note: a TTL index deletes events whether or not the relay published them; a relay down or "
    "behind for longer than the TTL loses them. Clean-up by checkpoint (RELAY_OUTBOX_RETENTION, or "
    "`outbox-relay outbox prune`) is the safe choice; with a TTL index, watch "
    "relay_outbox_ttl_headroom_seconds (the relay warns below RELAY_TTL_HEADROOM_WARN_S)"
)


def init_outbox(settings: Settings, ttl_seconds: int | None = None, outbox: str | None = None) -> list[str]:
    """Create each outbox collection (`outbox`: one of them) and its index on the occurrence time
    (a TTL index with `ttl_seconds`); returns one line per thing done."""
    parts = settings.parts()
    done: list[str] = []
    with mongo_client(parts.mongo) as client:
        check_mongodb(client, parts.mongo)
        for namespace in settings.pick_outboxes(outbox):
            done += Outbox(parts.mongo.outbox(client, namespace), parts.encoding.fields).init(ttl_seconds)
    return done if ttl_seconds is None else [*done, TTL_WARNING]


def prune_outbox(settings: Settings, dry_run: bool = False, outbox: str | None = None) -> list[str]:
    """`outbox prune [--dry-run] [--outbox NS]`: for each outbox (or the one named), delete (or,
    dry, count) the documents every partition's stored checkpoint covers and older than
    RELAY_OUTBOX_RETENTION (none set: 0 s)."""
    lines: list[str] = []
    for namespace in settings.pick_outboxes(outbox):
        lines += _prune(settings, namespace, dry_run)
    return lines


def _prune(settings: Settings, namespace: Namespace, dry_run: bool) -> list[str]:
    """One outbox's prune. Refuses, deleting nothing, while any of its partitions' checkpoints is
    unknown (relay.mongo.housekeeping)."""
    parts = settings.parts()
    retention = parts.cleanup.retention_s
    fields = parts.encoding.fields
    with mongo_client(parts.mongo) as client:
        check_mongodb(client, parts.mongo)
        cleaner = cleaner_for(client, parts.mongo, namespace, fields.occurred_at, parts.cleanup)
        shares = shares_of(namespace, settings.partitions, fields.aggregate_id)
        unknown = [p for p in (cleaner.checkpoint(lid) for lid, _ in shares) if p.time is None]
        if unknown:
            raise CheckpointUnknownError(
                "the relay's stored checkpoint is unknown, nothing deleted: "
                + "; ".join(f"{p.lease_id}: {p.why}" for p in unknown)
            )
        lines = [
            f"retention {retention or 0:.0f}s"
            + ("" if retention is not None else " (RELAY_OUTBOX_RETENTION is off: every covered document)")
            + (", dry run: nothing deleted" if dry_run else "")
        ]
        total = 0
        for lid, documents in shares:
            result = cleaner.run_pass(lid, documents, retention or 0.0, dry_run=dry_run)
            total += result.deleted
            verb = "would delete" if dry_run else "deleted"
            time = result.checkpoint.time
            lines.append(
                f"{lid}: stored checkpoint at cluster time {time.time if time else '?'}.{time.inc if time else '?'}; "
                f"{verb} {result.deleted} of {result.candidates} documents older than the retention "
                f"({result.kept_uncovered} not yet covered, kept)"
            )
        lines.append(f"{'would delete' if dry_run else 'deleted'} {total} documents in {namespace}")
        return lines

"""`outbox-relay replay`'s rules that need no server: the arguments, and where each part of the
range is read from (docs/replay.md).

A replay of `[since, until]` on one outbox reads at most two parts, in this order:

- **collection** (only when `since` lies before the oplog's oldest entry B): the outbox
  documents whose occurredAt lies in `[since, min(B, until))`, in (occurredAt, _id) order;
- **oplog**: a change stream opened at `max(since, B)`, the outbox's inserts up to `until`'s
  cluster time, in commit order. When a collection part precedes it, it serves only the
  documents whose occurredAt is at or after B (the older ones were the collection part's), so no
  event comes from both.

Within the oplog the range is by commit time (the insert's wall time); before it, by occurredAt
(the only time a document keeps). A range before the oplog whose oldest document is newer than
`since` may have lost events to clean-up (or a TTL index): that is a gap, refused unless the
operator allows it, or unless nothing can have removed them (`gap`, `Removals`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.core.errors import ConfigError, OperatorActionError
from relay.core.namespace import Namespace


class ReplayGapError(OperatorActionError):
    """Raised when part of the range is gone from both the outbox and the oplog (clean-up or a
    TTL index removed it); names the outbox and the span that is gone."""


class Source(enum.Enum):
    """Where a part of a replay is read from."""

    COLLECTION = "collection"
    OPLOG = "oplog"


@dataclass(frozen=True)
class Part:
    """One part of a replay on one outbox: read from `source`, over `[start, end]` (`end`
    excluded for the collection part); `occurred_from`: an oplog part that follows a collection
    part serves only documents whose occurredAt is at or after it."""

    source: Source
    start: dt.datetime
    end: dt.datetime
    occurred_from: dt.datetime | None = None


def check_range(since: dt.datetime, until: dt.datetime, now: dt.datetime) -> dt.datetime:
    """The range's end: `until`, at most `now`. ConfigError when `since` is in the future, when
    `until` lies before `since`, or when the range is empty (`until` equal to `since`)."""
    if since > now:
        raise ConfigError("--since", f"{iso(since)} is in the future (now {iso(now)})")
    until = min(until, now)
    if until < since:
        raise ConfigError("--until", f"{iso(until)} lies before --since {iso(since)}")
    if until == since:
        raise ConfigError("--until", f"the range is empty: --since and --until are both {iso(since)}")
    return until


def plan(since: dt.datetime, until: dt.datetime, oplog_start: dt.datetime) -> list[Part]:
    """The parts of `[since, until]` given the time of the oplog's oldest entry (the module
    docstring): a collection part only when `since` is before it, an oplog part only when `until`
    is not."""
    if since >= oplog_start:
        return [Part(Source.OPLOG, since, until)]
    if until < oplog_start:
        return [Part(Source.COLLECTION, since, until + dt.timedelta(milliseconds=1))]
    return [
        Part(Source.COLLECTION, since, oplog_start),
        Part(Source.OPLOG, oplog_start, until, occurred_from=oplog_start),
    ]


@dataclass(frozen=True)
class Removals:
    """What may have removed an outbox's documents before the oplog's start, as the servers tell
    (relay.mongo.replay_source): whether the oplog holds every write since the replica set began
    and no delete of the outbox (`complete_oplog`), its TTL index (field, seconds), and its
    clean-up as the lease documents record it (`cleanup_known`; `cleaned_before`: the newest cutoff
    a pass deleted below, None when clean-up never deleted anything)."""

    complete_oplog: bool = False
    ttl: tuple[str, int] | None = None
    cleanup_known: bool = False
    cleaned_before: dt.datetime | None = None


def unseen(parts: list[Part], oldest_document: dt.datetime | None) -> tuple[dt.datetime, dt.datetime] | None:
    """The span of a collection part that lies before the outbox's oldest document (by
    occurredAt; None: the outbox is empty), where events may be gone; None when there is none."""
    collection = next((p for p in parts if p.source is Source.COLLECTION), None)
    if collection is None or (oldest_document is not None and oldest_document <= collection.start):
        return None
    return collection.start, collection.end if oldest_document is None else min(oldest_document, collection.end)


def gap(
    namespace: Namespace,
    parts: list[Part],
    oldest_document: dt.datetime | None,
    oplog_start: dt.datetime,
    removals: Removals | None = None,
) -> str | None:
    """What may be gone from `namespace` for these parts, or None. A collection part starting before
    the outbox's oldest document may have lost the events before it, which the oplog no longer
    holds, unless nothing can have removed them: the oplog is complete, or the outbox has no TTL
    index and its clean-up never deleted anything that occurred in the span. Otherwise the span
    (cut at the clean-up's cutoff when only clean-up could remove documents) and its possible
    causes; "or there were none", since an empty span looks the same."""
    span = unseen(parts, oldest_document)
    removals = removals or Removals()
    if span is None or removals.complete_oplog:
        return None
    start, gone_until = span
    if removals.ttl is None and removals.cleanup_known:
        if removals.cleaned_before is None or removals.cleaned_before <= start:
            return None
        gone_until = min(gone_until, removals.cleaned_before)
    held = (
        "the outbox is empty" if oldest_document is None else f"its oldest document occurred at {iso(oldest_document)}"
    )
    return (
        f"{namespace}: events from {iso(start)} to {iso(gone_until)} may be gone: {held} and the oplog starts at "
        f"{iso(oplog_start)}; {_causes(removals)}, or there were none; replay from {iso(gone_until)}, or pass "
        "--allow-gap to replay what is left"
    )


def _causes(removals: Removals) -> str:
    """What may have removed the documents, as far as the servers tell."""
    causes = []
    if removals.ttl is not None:
        causes.append(f"a TTL index on {removals.ttl[0]} ({removals.ttl[1]} s) removes documents")
    if not removals.cleanup_known:
        causes.append("clean-up may have removed them (its lease documents keep no record of it)")
    elif removals.cleaned_before is not None:
        causes.append(f"clean-up removed documents that occurred before {iso(removals.cleaned_before)}")
    return " and ".join(causes)


def iso(moment: dt.datetime) -> str:
    """A time as the replay prints it: RFC 3339, UTC, milliseconds."""
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


REPLAY_HELP = "publish a time range of the outbox again, marked, beside the live relay (docs/replay.md)"
REPLAY_USAGE = (
    "%(prog)s (--since TIME | --resume REPLAY_ID) [--until TIME] [--outbox DATABASE.COLLECTION ...]\n"
    "       [--aggregate ID ...] [--aggregate-type TYPE ...] [--to-topic TOPIC] [--dry-run]\n"
    "       [--rate-limit EVENTS_PER_S] [--allow-gap] [--state-dir DIR] [--config FILE] [settings (RELAY_*) ...]"
)

# The replay's flags beside the settings (`run`'s, RELAY_*): flag, then argparse's options.
_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--outbox",), dict(action="append", metavar="DATABASE.COLLECTION",
                         help="replay this outbox (repeatable; default: every configured outbox, RELAY_OUTBOXES)")),
    (("--since",), dict(metavar="TIME",
                        help="start of the range, ISO 8601 (no zone: UTC); required, unless --resume")),
    (("--until",), dict(metavar="TIME", help="end of the range, ISO 8601 (default: now)")),
    (("--aggregate",), dict(action="append", default=[], metavar="ID", help="only this aggregate id (repeatable)")),
    (("--aggregate-type",), dict(action="append", default=[], metavar="TYPE",
                                 help="only this aggregate type (repeatable)")),
    (("--to-topic",), dict(metavar="TOPIC", help="publish every event to TOPIC (default: its usual topic)")),
    (("--dry-run",), dict(action="store_true", help="count per outbox and topic, publish nothing")),
    (("--rate-limit", "--rate"), dict(dest="rate_limit", type=float, metavar="EVENTS_PER_S",
                                      help="publish at most this many events per second (default: no limit)")),
    (("--allow-gap",), dict(action="store_true",
                            help="go on when part of the range is gone (clean-up removed it), replaying what is left")),
    (("--resume",), dict(metavar="REPLAY_ID",
                         help="continue an interrupted replay from its saved progress, with its range, filters "
                              "and rate limit (instead of --since)")),
    (("--state-dir",), dict(type=Path, metavar="DIR",
                            help="where replays save their progress until they finish (default: "
                                 "<RELAY_CACHE_DIR>/replays)")),
]  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The replay's flags, in a group of their own beside the settings (`run`'s: RELAY_*); the
    usage line shows that --since or --resume is required (REPLAY_USAGE)."""
    group = parser.add_argument_group("replay", "what to replay: --since TIME, or --resume REPLAY_ID")
    for flags, options in _FLAGS:
        group.add_argument(*flags, **options)

"""`outbox-relay inbox forget`: delete the inbox records of what a consumer lost, so that a replay
of the same events applies them again (the runbook: README, "Runbook: a consumer lost its state";
docs/inbox.md, "Forgetting records").

A record keeps its event's aggregate type and id, event type and occurredAt (relay.inbox.records).
`Selection` picks a group's records by the replay's filters and meanings (docs/replay.md):
`--since` / `--until` bound occurredAt (both included), `--aggregate` and `--aggregate-type` (each
repeatable) keep the records of those aggregate ids and types. Without any of them the command is
refused unless `--all` (every record of the group). The times are parsed and the range checked by
the replay's own rules (relay.commands.replay_plan, through the command line).

What is printed: the selection, then what it matches (how many records, per aggregate type, the
aggregates, the span of occurredAt, the dead-lettered ones among them), then what was deleted
(`--dry-run`: "would delete", nothing deleted); and how many of the group's records no filter can
select (written by 0.2 or earlier, before the records kept the event's fields, or the dead letter
of a message that could not be decoded: they expire with the retention).

Exit codes (README, "Exit codes"): 0 done (also when the selection matches nothing: 0 records), 2 no
filter and no `--all`, `--all` with a filter, a reversed or empty range or a time that is not ISO
8601, an inbox collection holding no record of the group (a mistyped group or collection: the
line names the groups it holds), 3 MongoDB unreachable.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pymongo.collection import Collection

from relay.config import Settings
from relay.core.errors import ConfigError
from relay.core.namespace import Namespace, NamespaceError
from relay.core.times import rfc3339
from relay.inbox.records import EVENT_FIELDS, MAJORITY
from relay.mongo.connection import check_mongodb, mongo_client

DEFAULT_COLLECTION = "inbox"
GROUPS_SHOWN = 10  # a group with no records: the line names at most this many of the groups there are
AGGREGATES_SHOWN = 10

_AGGREGATE_TYPE, _AGGREGATE_ID, _OCCURRED_AT = (
    EVENT_FIELDS["aggregate_type"],
    EVENT_FIELDS["aggregate_id"],
    EVENT_FIELDS["occurred_at"],
)


@dataclass(frozen=True)
class Selection:
    """The records of `group` to forget: of the events that occurred in `[since, until]` (None: no
    bound), of the aggregate ids and types given (empty: any); `every`: all of the group's.

    Built checked: ConfigError naming the flag when no filter is given without `every`, or
    `every` with a filter (the range itself is checked where the times are parsed)."""

    group: str
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    aggregate_ids: tuple[str, ...] = ()
    aggregate_types: tuple[str, ...] = ()
    every: bool = False

    def __post_init__(self) -> None:
        if not self.group:
            raise ConfigError("--group", "is required: the consumer group whose records to forget")
        filtered = self.filtered
        if self.every and filtered:
            raise ConfigError(
                "--all",
                "forgets every record of the group: give it without --since, --until, --aggregate or "
                "--aggregate-type, or drop it to forget the selection",
            )
        if not self.every and not filtered:
            raise ConfigError(
                "--all",
                f"no filter given: pass --since/--until, --aggregate or --aggregate-type to pick the records of "
                f"group {self.group!r} to forget, or --all to forget every one of them",
            )

    @property
    def filtered(self) -> bool:
        return bool(self.since or self.until or self.aggregate_ids or self.aggregate_types)

    def query(self) -> dict[str, Any]:
        """The records selected, as a MongoDB filter (served by the selection indexes)."""
        query: dict[str, Any] = {"group": self.group}
        if self.aggregate_ids:
            query[_AGGREGATE_ID] = {"$in": list(self.aggregate_ids)}
        if self.aggregate_types:
            query[_AGGREGATE_TYPE] = {"$in": list(self.aggregate_types)}
        bounds = {op: t for op, t in (("$gte", self.since), ("$lte", self.until)) if t is not None}
        if bounds:
            query[_OCCURRED_AT] = bounds
        return query

    def described(self) -> str:
        """The selection in words, for the first line."""
        if self.every:
            return f"every record of group {self.group}"
        parts = [f"the records of group {self.group}"]
        if self.aggregate_types:
            parts.append(f"aggregate type {' or '.join(self.aggregate_types)}")
        if self.aggregate_ids:
            parts.append(f"aggregate {' or '.join(self.aggregate_ids)}")
        if self.since or self.until:
            start = rfc3339(self.since) if self.since else "the first"
            end = rfc3339(self.until) if self.until else "now"
            parts.append(f"events that occurred from {start} to {end}")
        return ", ".join(parts)


def inbox_namespace(text: str | None, database: str) -> Namespace:
    """The inbox collection `--inbox` names: `DATABASE.COLLECTION`, or a collection of `database`
    (RELAY_DATABASE); default `inbox` there. ConfigError naming --inbox otherwise."""
    text = text or DEFAULT_COLLECTION
    try:
        return Namespace.parse(text) if "." in text else Namespace(database, text)
    except NamespaceError as exc:
        raise ConfigError("--inbox", str(exc)) from exc


def forget_records(settings: Settings, selection: Selection, inbox: str | None, dry_run: bool) -> Iterator[str]:
    """Connect (RELAY_MONGODB_URI), then the lines of `Forgetting.run` for the inbox collection
    `inbox` (inbox_namespace)."""
    mongo = settings.parts().mongo
    namespace = inbox_namespace(inbox, settings.database)
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)
        collection = client[namespace.database].get_collection(namespace.collection, write_concern=MAJORITY)
        yield from Forgetting(collection, namespace, selection).run(dry_run)


class Forgetting:
    """One `inbox forget` on one inbox collection: what it selects, then the deletion."""

    def __init__(self, collection: Collection[Any], namespace: Namespace, selection: Selection) -> None:
        self._collection = collection
        self._namespace = namespace
        self._selection = selection

    def run(self, dry_run: bool) -> Iterator[str]:
        """The lines: the selection, what it matches, what was (or would be) deleted, and the
        group's records no filter selects. ConfigError when the group has no record here."""
        selection = self._selection
        self._check_group()
        yield f"{self._namespace}: {selection.described()}"
        matched, summary = self._summary()
        verb = "would delete" if dry_run else "deleting"
        yield f"{verb} {_records(matched)}" + (f": {summary}" if summary else "")
        if dry_run:
            yield "dry run: nothing deleted"
        else:
            deleted = self._collection.delete_many(selection.query()).deleted_count
            yield f"deleted {_records(deleted)} of group {selection.group} from {self._namespace}"
        unselectable = 0 if selection.every else self._without_event_fields()
        if unselectable:
            yield (
                f"note: group {selection.group} also has {_records(unselectable)} no filter selects (without the "
                "event's fields: written by outbox-relay 0.2 or earlier, or the dead letter of an undecodable "
                "message); --all selects them, else they expire with the inbox's retention"
            )

    def _check_group(self) -> None:
        group = self._selection.group
        if self._collection.find_one({"group": group}, projection={"_id": 1}) is not None:
            return
        groups = sorted(str(g) for g in self._collection.distinct("group"))
        held = (
            f"groups there: {', '.join(groups[:GROUPS_SHOWN])}" + (" ..." if len(groups) > GROUPS_SHOWN else "")
            if groups
            else "it holds no records at all"
        )
        raise ConfigError("--group", f"{self._namespace} holds no records of group {group!r} ({held})")

    def _summary(self) -> tuple[int, str]:
        """How many records the selection matches, and what they are: per aggregate type (with its
        aggregates, the first few named), the span of occurredAt, the dead-lettered ones."""
        rows = list(
            self._collection.aggregate(
                [
                    {"$match": self._selection.query()},
                    {
                        "$group": {
                            "_id": {"type": f"${_AGGREGATE_TYPE}", "id": f"${_AGGREGATE_ID}"},
                            "records": {"$sum": 1},
                            "deadLettered": {"$sum": {"$cond": [{"$eq": ["$deadLettered", True]}, 1, 0]}},
                            "first": {"$min": f"${_OCCURRED_AT}"},
                            "last": {"$max": f"${_OCCURRED_AT}"},
                        }
                    },
                    {"$sort": {"_id.type": 1, "_id.id": 1}},
                ]
            )
        )
        matched = sum(r["records"] for r in rows)
        if not rows:
            return 0, ""
        per_type: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            per_type.setdefault(row["_id"].get("type") or "(no event fields)", []).append(row)
        described = []
        for kind, aggregates in per_type.items():
            named = [str(r["_id"]["id"]) for r in aggregates if r["_id"].get("id") is not None]
            shown = ", ".join(named[:AGGREGATES_SHOWN]) + (" ..." if len(named) > AGGREGATES_SHOWN else "")
            count = sum(r["records"] for r in aggregates)
            described.append(f"{kind} {count} ({_plural(len(named), 'aggregate')}" + (f": {shown})" if named else ")"))
        times = [t for r in rows for t in (r["first"], r["last"]) if isinstance(t, dt.datetime)]
        parts = ["; ".join(described)]
        if times:
            parts.append(f"occurred from {rfc3339(min(times))} to {rfc3339(max(times))}")
        dead = sum(r["deadLettered"] for r in rows)
        if dead:
            parts.append(f"{dead} dead-lettered (a replay runs their handler again)")
        return matched, "; ".join(parts)

    def _without_event_fields(self) -> int:
        return self._collection.count_documents({"group": self._selection.group, _OCCURRED_AT: None})


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _records(count: int) -> str:
    return _plural(count, "record")

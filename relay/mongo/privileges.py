"""The least MongoDB privileges the relay needs, per mode, and the start-up check that it has them.

`required()` lists them for given settings (docs/security.md has the same table, and
`outbox-relay security role` prints them as a `createRole` document). Each privilege names why:

- each outbox: `find` + `changeStream` (the change stream, the re-scan, the outbox checks' count
  and oldest-undelivered reads), `listIndexes` (the TTL headroom check); `remove` only with
  clean-up on (RELAY_OUTBOX_RETENTION). Where one database holds several outboxes of RELAY_OUTBOXES,
  the shared stream is the database's: `find` + `changeStream` on the database (every
  collection); with RELAY_CHANGE_STREAMS=cluster, on every database (relay.mongo.shared_reader);
- the lease collection: `find`, `insert`, `update` (leases are taken with upserting
  find-and-modify) and `remove` (a change of RELAY_PARTITIONS, either way, back to 1 included,
  replaces the lease documents at the next start: the relay cannot know beforehand, so every mode
  holds it); its `_replicas` companion: `find`, `insert`, `update` (every replica records itself);
- `local.oplog.rs`: `find` (where `oplog-start` begins, the clean-up's coverage check);
- an inbox collection (relay.inbox, optional): `find` and `insert` (the ids of processed events),
  `createIndex` (its unique, selection and TTL indexes, at every start) and `collMod` (a changed
  retention changes the TTL index); the inbox never updates or removes a record (the TTL monitor
  does, and an operator's `outbox-relay inbox forget`, with `remove` of the operator's own).

Exactly-once mode needs nothing more on MongoDB (its offsets live in Kafka).

`check()` compares the privileges of the authenticated user (`connectionStatus` with
`showPrivileges`) with `required()` and raises `PermissionDeniedError` naming every action and
namespace missing, so a least-privilege deployment that grants too little stops at start with
one line instead of at the first write. With authentication off (no user) it checks nothing.
It reads resources as MongoDB does, but generously where the server's rules are subtle (an empty
database name counts as any database, `local` included): it never stops a relay the server would
let run; the server's own refusal (Unauthorized) is translated by relay.mongo.errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from relay.core.errors import PermissionDeniedError
from relay.core.namespace import Namespace
from relay.mongo.config import CLUSTER, PER_DATABASE, MongoConfig, OutboxCleanupConfig

OPLOG = ("local", "oplog.rs")
HINT = "docs/security.md; outbox-relay security role prints the role"


@dataclass(frozen=True)
class Privilege:
    """Actions on one collection, and why the relay needs them."""

    db: str
    collection: str
    actions: tuple[str, ...]
    why: str

    @property
    def namespace(self) -> str:
        if not self.db:
            return "every database"
        return f"{self.db}.{self.collection}" if self.collection else f"{self.db} (every collection)"

    def document(self) -> dict[str, Any]:
        """As `createRole` takes it."""
        return {"resource": {"db": self.db, "collection": self.collection}, "actions": list(self.actions)}


def required(
    database: str,
    outboxes: Sequence[Namespace],
    leases: str,
    *,
    cleanup: bool,
    inbox: str | None = None,
    streams: str = PER_DATABASE,
) -> list[Privilege]:
    """The privileges the relay needs with these settings (the module docstring says why):
    `database` holds the leases; `outboxes` are the deployment's (RELAY_OUTBOXES, or the one
    RELAY_DATABASE.RELAY_OUTBOX_COLLECTION)."""
    lease_actions = ("find", "insert", "update", "remove")
    out = [*_outbox_privileges(outboxes, streams, cleanup)]
    out += [
        Privilege(database, leases, lease_actions, "leases, fencing tokens and checkpoints"),
        Privilege(database, f"{leases}_replicas", ("find", "insert", "update"), "which replicas are alive"),
        Privilege(*OPLOG, ("find",), "where oplog-start begins; clean-up coverage"),
    ]
    if inbox:
        out.append(
            Privilege(
                database,
                inbox,
                ("find", "insert", "createIndex", "collMod"),
                "relay.inbox: ids seen, indexes, retention",
            )
        )
    return out


def _outbox_privileges(outboxes: Sequence[Namespace], streams: str, cleanup: bool) -> list[Privilege]:
    """Each outbox's own actions, and the change stream's where it reads a database or the cluster."""
    own = ("find", "listIndexes", *(("remove",) if cleanup else ()))
    why = "re-scan, outbox checks" + (", clean-up deletes" if cleanup else "")
    by_db: dict[str, list[str]] = {}
    for namespace in outboxes:
        by_db.setdefault(namespace.database, []).append(namespace.collection)
    out: list[Privilege] = []
    if streams == CLUSTER:
        out.append(
            Privilege("", "", ("find", "changeStream"), "the cluster's change stream (RELAY_CHANGE_STREAMS=cluster)")
        )
    for db, colls in by_db.items():
        if streams != CLUSTER and len(colls) > 1:
            out.append(
                Privilege(db, "", ("find", "changeStream"), f"the change stream of database {db} (its outboxes)")
            )
        for coll in colls:
            single = streams != CLUSTER and len(colls) == 1
            actions = (*own[:1], "changeStream", *own[1:]) if single else own
            out.append(Privilege(db, coll, actions, ("change stream, " if single else "") + why))
    return out


def required_for(
    mongo: MongoConfig, outboxes: Sequence[Namespace], cleanup: OutboxCleanupConfig, inbox: str | None = None
) -> list[Privilege]:
    """`required()` for the relay's MongoDB and clean-up configurations and its `outboxes`."""
    return required(
        mongo.database,
        outboxes,
        mongo.lease_collection,
        cleanup=cleanup.retention_s is not None,
        inbox=inbox,
        streams=mongo.change_streams,
    )


def role_document(role: str, privileges: Sequence[Privilege]) -> dict[str, Any]:
    """The `createRole` command for a role holding exactly `privileges` (run it on `admin`)."""
    return {"createRole": role, "privileges": [p.document() for p in privileges], "roles": []}


def _covers(resource: Mapping[str, Any], db: str, collection: str) -> bool:
    if resource.get("anyResource"):
        return True
    if "db" not in resource or "collection" not in resource:
        return False  # the cluster resource
    db_ok = resource["db"] in ("", db)
    coll = resource["collection"]
    return db_ok and (coll == collection or (coll == "" and not collection.startswith("system.")))


def missing(held: Iterable[Mapping[str, Any]], needed: Sequence[Privilege]) -> list[tuple[str, str]]:
    """(action, namespace) for every needed action no held privilege grants."""
    held = list(held)
    gaps: list[tuple[str, str]] = []
    for p in needed:
        granted: set[str] = set()
        for h in held:
            if _covers(h.get("resource", {}), p.db, p.collection):
                actions = set(h.get("actions", ()))
                granted |= set(p.actions) if "anyAction" in actions else actions
        gaps += [(action, p.namespace) for action in p.actions if action not in granted]
    return gaps


def check(client: MongoClient[Any], needed: Sequence[Privilege]) -> None:
    """Raise PermissionDeniedError naming what the authenticated user lacks (nothing with
    authentication off)."""
    status = client.admin.command({"connectionStatus": 1, "showPrivileges": True})
    info = status.get("authInfo", {})
    if not info.get("authenticatedUsers"):
        return
    gaps = missing(info.get("authenticatedUserPrivileges", []), needed)
    if gaps:
        users = ", ".join(f"{u.get('user')}@{u.get('db')}" for u in info["authenticatedUsers"])
        raise PermissionDeniedError.missing("MongoDB", users, gaps, HINT)

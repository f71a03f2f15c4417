"""An outbox's MongoDB namespace: its database and collection. Pure: no I/O.

`Namespace` travels wherever an outbox is meant, from RELAY_OUTBOXES's parsing
(relay.config.sources) to the server (a scope, a shared stream's plan, the lease documents'
regular expressions, the oplog's `ns`), so nothing splits a `"db.coll"` string by hand and no
signature takes the text where it means the outbox. Its text, `str(ns)`, is the
`database.collection` form every user-visible string keeps: lease ids, log fields, metric
labels, status output. `parse` is called only where a user's text comes in (the setting, a
command's `--outbox` or `--inbox`).

Invariants checked here: the database is non-empty and holds none of ` /\\".$`; the collection
is non-empty (it may hold dots: `app.orders.v2` is collection `orders.v2` of database `app`).
"""

from __future__ import annotations

from dataclasses import dataclass

_DATABASE_FORBIDDEN = ' /\\"$.'


class NamespaceError(ValueError):
    """Raised when a text or a pair is not a `database.collection` namespace."""


@dataclass(frozen=True, order=True)
class Namespace:
    """The outbox collection `collection` of database `database`."""

    database: str
    collection: str

    def __post_init__(self) -> None:
        if not self.database or any(c in self.database for c in _DATABASE_FORBIDDEN):
            raise NamespaceError(f"not a database name: {self.database!r} (in {self.database}.{self.collection})")
        if not self.collection:
            raise NamespaceError(f"no collection in {self.database}.{self.collection!r}")

    @classmethod
    def parse(cls, text: str) -> Namespace:
        """`"db.coll"` as a Namespace (split at the first dot); NamespaceError names what is wrong."""
        database, dot, collection = text.partition(".")
        if not dot:
            raise NamespaceError(f"expected database.collection, got {text!r}")
        return cls(database, collection)

    def __str__(self) -> str:
        return f"{self.database}.{self.collection}"

"""The relay's connections as the MongoDB server sees them (appName outbox-relay): a
`failCommand` fail point on their commands (`failpoint`), and their change stream cursors now
(`change_streams`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any


class failpoint:
    """`configureFailPoint failCommand` for the relay's connections only (appName outbox-relay)."""

    def __init__(self, client: Any, mode: Any, **data: Any) -> None:
        self.client, self.mode, self.data = client, mode, {"appName": "outbox-relay", **data}

    def __enter__(self) -> failpoint:
        self.client.admin.command("configureFailPoint", "failCommand", mode=self.mode, data=self.data)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.admin.command("configureFailPoint", "failCommand", mode="off")


def change_streams(client: Any, databases: Iterable[str]) -> list[dict[str, Any]]:
    """The originating commands of the relays' change stream cursors on `databases` now, idle or
    in a getMore (`$currentOp`)."""
    ops = client.admin.aggregate([
        {"$currentOp": {"idleCursors": True, "allUsers": True}},
        {"$match": {"appName": "outbox-relay", "cursor.originatingCommand.aggregate": {"$exists": True}}}])
    commands = [op["cursor"]["originatingCommand"] for op in ops]
    return [c for c in commands if c.get("$db") in set(databases) and "$changeStream" in c["pipeline"][0]]


@contextmanager
def transaction_lifetime(client: Any, seconds: int) -> Iterator[None]:
    """The server aborts a transaction left open after `seconds` (transactionLifetimeLimitSeconds,
    60 by default) until the block ends, then the limit it had: a killed consumer's open transaction
    keeps its write locks until then, and its successor's transactions on the same documents
    conflict and retry meanwhile."""
    admin = client.admin
    before = admin.command("getParameter", 1, transactionLifetimeLimitSeconds=1)["transactionLifetimeLimitSeconds"]
    admin.command("setParameter", 1, transactionLifetimeLimitSeconds=seconds)
    try:
        yield
    finally:
        admin.command("setParameter", 1, transactionLifetimeLimitSeconds=before)

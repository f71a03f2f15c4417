"""One change stream cursor, run through MongoDB's documented commands.

The change streams specification (shared/reference, 003) describes the commands; pymongo's public
command API runs them (`Database.command`, an explicit session, a raw-BSON codec): an `aggregate`
with a `$changeStream` stage opens the cursor, each read is one `getMore`, and every reply carries
its whole batch and its `postBatchResumeToken`. So the token a read carries is the server's own
statement of what it covers, with no driver state in between.

- `open(at)` runs the aggregate with `batchSize: 0` at a cluster time (`startAtOperationTime`) or
  "now": no change is returned, and the reply's post-batch token is the opening position. The
  server checks a start point only when it first runs the pipeline, so the first `read` after an
  open at a time is what raises HistoryLostError when that time left the oplog.
- `read(n)` runs one getMore with `batchSize: n` and `maxTimeMS` = RELAY_MAX_AWAIT_MS: at most n
  changes, still raw, and the post-batch token covering exactly them (and every oplog entry
  scanned after them), which still advances on an idle outbox (guarantee 7).
- A collection's stream aggregates on the collection; a database's on the database (`aggregate:
  1`); the cluster's on `admin` with `allChangesForCluster`.

One thread at a time uses a cursor (relay.mongo.shared_reader's reader thread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, NamedTuple

from bson import Int64, Timestamp
from pymongo import MongoClient
from pymongo.client_session import ClientSession
from pymongo.database import Database
from pymongo.errors import PyMongoError

from relay.core.errors import StreamInvalidatedError
from relay.core.positions import Token
from relay.mongo.codecs import RAW_CHANGE_CODEC, cursor_batch
from relay.mongo.errors import translate


def oplog_start(client: MongoClient[Any]) -> Timestamp:
    """The time of the oldest entry in the oplog: the earliest a change stream can start."""
    oldest = client.local["oplog.rs"].find_one({}, projection={"ts": 1}, sort=[("$natural", 1)])
    if oldest is None:
        raise StreamInvalidatedError("the oplog is empty or unreadable: is this a replica set?")
    return oldest["ts"]  # type: ignore[no-any-return]


class Read(NamedTuple):
    """One getMore's reply: its raw changes (each change event's BSON) and its post-batch token."""

    changes: list[bytes]
    token: Token


class Cursor:
    """A change stream cursor on `database` (None: the cluster's), on `collection` when given,
    with `stages` after `$changeStream`, in a session of its own."""

    def __init__(
        self,
        client: MongoClient[Any],
        database: str | None,
        collection: str | None,
        stages: list[dict[str, Any]],
        max_await_ms: int,
    ) -> None:
        self._db: Database[Any] = client[database if database is not None else "admin"]
        self._cluster = database is None
        self._collection = collection
        self._stages = stages
        self._max_await_ms = max_await_ms
        self._session: ClientSession | None = None
        self._id = 0  # 0: no cursor open

    def _command(self, command: dict[str, Any]) -> Any:
        return self._db.command(command, session=self._session, codec_options=RAW_CHANGE_CODEC)

    def open(self, at: Timestamp | None) -> Token:
        """Open at the cluster time `at` (None: now); returns the opening post-batch token."""
        self.close()
        options: dict[str, Any] = {"allChangesForCluster": True} if self._cluster else {}
        if at is not None:
            options["startAtOperationTime"] = at
        self._session = self._db.client.start_session(causal_consistency=False)
        try:
            reply = self._command(
                {
                    "aggregate": self._collection if self._collection is not None else 1,
                    "pipeline": [{"$changeStream": options}, *self._stages],
                    "cursor": {"batchSize": 0},
                }
            )
        except PyMongoError as exc:
            raise translate(exc) from exc
        self._id, _, token = cursor_batch(reply["cursor"])  # batchSize 0: no change
        return _post_batch_token(token)

    @property
    def alive(self) -> bool:
        """Whether the server still holds the cursor (an invalidate ends it)."""
        return self._id != 0

    def read(self, max_events: int, await_ms: int | None = None) -> Read:
        """One getMore: at most `max_events` changes, waiting up to `await_ms` (default
        RELAY_MAX_AWAIT_MS) when there are none. Raises pymongo's errors as they are (the reader
        decides which it resumes)."""
        reply = self._command(
            {
                "getMore": Int64(self._id),
                "collection": self._collection if self._collection is not None else "$cmd.aggregate",
                "batchSize": max_events,
                "maxTimeMS": self._max_await_ms if await_ms is None else await_ms,
            }
        )
        self._id, changes, token = cursor_batch(reply["cursor"])
        return Read(changes, _post_batch_token(token))

    def close(self) -> None:
        """Release the server's cursor and the session (best effort: a cursor on a dead
        connection times out); safe to call twice."""
        cursor_id, self._id = self._id, 0
        if cursor_id:
            with contextlib.suppress(PyMongoError):
                self._command({"killCursors": self._collection or "$cmd.aggregate", "cursors": [Int64(cursor_id)]})
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(PyMongoError):
                session.end_session()


def _post_batch_token(token: Mapping[str, Any] | None) -> Token:
    if token is None:  # the spec's rule: no resume without a token
        raise StreamInvalidatedError(
            "the change stream reply carries no postBatchResumeToken (MongoDB 4.2 or later is needed)"
        )
    return dict(token)

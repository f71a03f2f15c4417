"""The outbox's change stream, read through MongoDB's documented commands.

The source runs the change stream itself, as the change streams specification (shared/reference,
003) describes it, with pymongo's public command API (`Database.command`, an explicit session,
a raw-BSON codec): an `aggregate` with a `$changeStream` stage opens the cursor, each read is one
`getMore`, and every reply carries the whole server batch and its `postBatchResumeToken`. So the
token a batch carries is the server's own statement of what it covers, with no driver state in
between:

- `open()` runs the aggregate with `batchSize: 0`: no change is returned, and the reply's
  post-batch token is the opening position (for `now`, the current one; the loop stores it at
  once when there is no checkpoint, so a crash cannot move the start to a later "now"). The
  server checks a resume point only when it first runs the pipeline, so an open at a resume
  point (a token or a cluster time) also runs one getMore (`batchSize: 1`, 1 ms await): a point
  that left the oplog raises HistoryLostError from `open()`, where the loop's history-lost policy
  applies; the change that read may return is held, and the first `next_batch` tops it up to a
  whole read (one more getMore, whose token covers both).
- `next_batch(n)` runs one getMore with `batchSize: n` and `maxTimeMS` = RELAY_MAX_AWAIT_MS. The
  server returns at most n changes and a post-batch token covering exactly them (and any
  filtered-out oplog entries scanned after them), or, with none, a token that still advances on
  an idle outbox (guarantee 7).
- Read-ahead: after a read that returned changes (a catch-up), the next getMore is sent at once
  from a reader thread, so mongod scans the oplog while the loop encodes and publishes. The
  session and cursor are used by one thread at a time: the loop's thread touches them only after
  collecting the read in flight. A read-ahead's changes are returned whole, under their own
  post-batch token, by the next `next_batch` whose limit they fit; while they do not fit (the
  window shrank), `next_batch` returns no change under the previous token and keeps them.
- A drop, rename or invalidate ends the stream: the inserts before it form a batch whose token is
  the last insert's own `_id`; the next read raises StreamInvalidatedError.
- Resumable errors (relay.mongo.errors.resumable: network errors, CursorNotFound, errors labelled
  ResumableChangeStreamError) on a getMore are resumed once, in the same session, by a new
  aggregate with `resumeAfter` = the token of the last batch returned (spec, Resume Process). The
  batch of that read is then empty and says `resumed` (a metric; nothing is replayed). Any other
  error, and a failed resume, reaches the loop, which restarts from its stored checkpoint.

History lost with RELAY_ON_HISTORY_LOST=rescan (`rescan()`, relay.mongo.rescan): the stream
opens at "now", every outbox document is served as a batch without a token, then an empty batch
carries the opening token, then the stream continues.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple

from bson import Int64, Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from relay.core.change import Batch, Change
from relay.core.errors import StreamInvalidatedError, TransientError
from relay.core.positions import StartPoint, Token
from relay.mongo.codecs import RAW_CHANGE_CODEC, read_changes
from relay.mongo.errors import resumable, translate
from relay.mongo.pipeline import PIPELINE
from relay.mongo.rescan import rescan_changes


def oplog_start(client: MongoClient[Any]) -> Timestamp:
    """The time of the oldest entry in the oplog: the earliest a change stream can start."""
    oldest = client.local["oplog.rs"].find_one({}, projection={"ts": 1}, sort=[("$natural", 1)])
    if oldest is None:
        raise StreamInvalidatedError("the oplog is empty or unreadable: is this a replica set?")
    return oldest["ts"]  # type: ignore[no-any-return]


class _Read(NamedTuple):
    """One getMore's reply: its changes, the cursor id after it, and its post-batch token."""

    changes: list[RawBSONDocument]
    cursor_id: int
    token: dict[str, Any]


class Pending:
    """The read the loop has not taken yet, in one explicit state (`state`):

    - EMPTY: none; the next `next_batch` sends a getMore of its own.
    - IN_FLIGHT: a read-ahead getMore runs on the reader thread (`send`).
    - HELD: a returned read not handed out yet: a read-ahead bigger than the room the loop had.
    - PROBED: the one change the probe at `open()` returned, to be topped up to a whole read.

    `take()` leaves it EMPTY whatever it returns or raises. Only the loop's thread calls these;
    the session and cursor are used by one thread at a time because the loop's thread touches
    them only after `take()` or `discard()` collected a read in flight.
    """

    class State(enum.Enum):
        EMPTY = "empty"
        IN_FLIGHT = "in flight"
        HELD = "held"
        PROBED = "probed"

    def __init__(self) -> None:
        self.state = Pending.State.EMPTY
        self._read: _Read | None = None
        self._future: Future[_Read] | None = None
        self._reader: ThreadPoolExecutor | None = None

    def send(self, get_more: Callable[[], _Read]) -> None:
        """Run `get_more` on the reader thread (EMPTY -> IN_FLIGHT)."""
        assert self.state is Pending.State.EMPTY, f"a read is {self.state.value}"
        if self._reader is None:
            self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-change-stream")
        self._future, self.state = self._reader.submit(get_more), Pending.State.IN_FLIGHT

    def hold(self, read: _Read, probed: bool = False) -> None:
        """Keep `read` for a later `take()` (EMPTY -> HELD or PROBED)."""
        assert self.state is Pending.State.EMPTY, f"a read is {self.state.value}"
        self._read, self.state = read, (Pending.State.PROBED if probed else Pending.State.HELD)

    def take(self) -> tuple[_Read | None, bool]:
        """(the pending read, whether it is the probe's), waiting for one in flight (its error is
        raised here); (None, False) when EMPTY. Leaves the state EMPTY."""
        read, future, probed = self._read, self._future, self.state is Pending.State.PROBED
        self._read, self._future, self.state = None, None, Pending.State.EMPTY
        return (future.result() if future is not None else read), probed

    def ready(self, timeout: float) -> bool:
        """Whether `take()` returns without waiting on the server: a read is HELD or PROBED, or
        the one IN_FLIGHT comes back within `timeout` seconds; False when EMPTY."""
        if self.state is Pending.State.IN_FLIGHT:
            assert self._future is not None
            done, _ = wait([self._future], timeout=max(0.0, timeout))
            return bool(done)
        return self.state is not Pending.State.EMPTY

    def discard(self) -> None:
        """Drop the pending read, waiting for one in flight to end (its outcome no longer matters)."""
        with contextlib.suppress(Exception):
            self.take()

    def shutdown(self) -> None:
        """Drop the pending read and stop the reader thread; safe to call twice."""
        self.discard()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.shutdown()


class ChangeSource:
    """Reads the outbox collection's change stream in batches (relay.core.boundaries.ChangeSource).

    One cursor at a time, in one session of its own (a cursor opened in a session is only served
    to getMores in that session). Not thread-safe: one loop uses it.
    """

    def __init__(
        self,
        collection: Collection[Any],
        max_await_ms: int,
        occurred_at_field: str = "occurredAt",
        pipeline: list[dict[str, Any]] = PIPELINE,
        scan_filter: Mapping[str, Any] | None = None,
        read_ahead: bool = True,
    ) -> None:
        """`pipeline` is the stream's (relay.mongo.pipeline.pipeline); `scan_filter` selects the
        documents a rescan serves (one partition's, with RELAY_PARTITIONS > 1); `read_ahead` sends
        the next getMore while the loop publishes (see the module's docstring)."""
        self._collection = collection
        self._db = collection.database
        self._pipeline = pipeline
        self._scan_filter = scan_filter
        self._max_await_ms = max_await_ms
        self._occurred_at_field = occurred_at_field
        self._session: ClientSession | None = None
        self._cursor_id = 0  # 0: no cursor open
        self._token: dict[str, Any] | None = None  # covers every change returned so far
        self._scan: Iterator[Change] | None = None
        self._read_ahead = read_ahead
        self._pending = Pending()  # the read not handed out yet: probe, read-ahead
        self._ended: StreamInvalidatedError | None = None  # raised by the next read

    # ---- the commands ---------------------------------------------------------------------------

    def _command(self, command: dict[str, Any]) -> Any:
        return self._db.command(command, session=self._session, codec_options=RAW_CHANGE_CODEC)

    def _aggregate(self, resume_after: Token | None, at_time: Timestamp | None) -> None:
        """Open a cursor (`batchSize: 0`: no change yet, only the opening post-batch token)."""
        options: dict[str, Any] = {}
        if resume_after is not None:
            options["resumeAfter"] = dict(resume_after)
        elif at_time is not None:
            options["startAtOperationTime"] = at_time
        reply = self._command(
            {
                "aggregate": self._collection.name,
                "pipeline": [{"$changeStream": options}, *self._pipeline],
                "cursor": {"batchSize": 0},
            }
        )
        cursor = reply["cursor"]
        self._cursor_id = int(cursor["id"])
        self._token = self._post_batch_token(cursor)

    def _get_more(self, max_events: int, await_ms: int | None = None) -> _Read:
        """One getMore; changes nothing in `self` (it may run on the reader thread)."""
        reply = self._command(
            {
                "getMore": Int64(self._cursor_id),
                "collection": self._collection.name,
                "batchSize": max_events,
                "maxTimeMS": self._max_await_ms if await_ms is None else await_ms,
            }
        )
        cursor = reply["cursor"]
        return _Read(list(cursor["nextBatch"]), int(cursor["id"]), self._post_batch_token(cursor))

    @staticmethod
    def _post_batch_token(cursor: Mapping[str, Any]) -> dict[str, Any]:
        token = cursor.get("postBatchResumeToken")
        if token is None:  # the spec's rule: no resume without a token
            raise StreamInvalidatedError(
                "the change stream reply carries no postBatchResumeToken (MongoDB 4.2 or later is needed)"
            )
        return dict(token)

    def _kill_cursor(self) -> None:
        """Release the server's cursor; best effort (a cursor on a dead connection times out)."""
        self._pending.discard()  # the session serves one command at a time
        if self._cursor_id:
            cursor_id, self._cursor_id = self._cursor_id, 0
            with contextlib.suppress(PyMongoError):
                self._command({"killCursors": self._collection.name, "cursors": [Int64(cursor_id)]})

    # ---- relay.core.boundaries.ChangeSource ---------------------------------------------------

    def open(self, start: StartPoint) -> None:
        """Open the stream at `start`; raises HistoryLostError when that point left the oplog (at
        the oplog's start too: the oldest entry rolled over between reading it and opening)."""
        self.close()
        at_time = None if start.at_time is None else Timestamp(start.at_time.time, start.at_time.inc)
        if start.oplog_start:
            at_time = oplog_start(self._db.client)
        self._session = self._db.client.start_session(causal_consistency=False)
        try:
            self._aggregate(start.resume_after, at_time)
            if start.resume_after is not None or at_time is not None:
                self._probe()
        except PyMongoError as exc:
            raise translate(exc) from exc

    def _probe(self) -> None:
        """Run the pipeline once so the server checks the resume point; hold what it returns.

        Invariant: `token` stays the opening token until the held change is handed out, so
        nothing is ever covered by a token before `next_batch` has returned it."""
        read = self._get_more(1, await_ms=1)
        self._cursor_id = read.cursor_id
        if read.changes:
            self._pending.hold(read, probed=True)

    def rescan(self) -> None:
        """Open at "now", then serve every outbox document (relay.mongo.rescan), then the opening token."""
        self.open(StartPoint())
        if self._token is None:
            raise TransientError("no opening token for the stream before the rescan; retrying")
        self._scan = rescan_changes(self._collection, self._occurred_at_field, self._scan_filter)

    @property
    def token(self) -> Token | None:
        """The token covering every change returned so far (the opening one right after `open`)."""
        return self._token

    def next_batch(self, max_events: int) -> Batch:
        """Return the changes available now, at most `max_events`, with the token after them.

        Waits at most about RELAY_MAX_AWAIT_MS when none are. An empty batch still carries the
        newest post-batch token, so an idle outbox's checkpoint can advance. Raises
        StreamInvalidatedError on drop / rename / invalidate, and the translated server error
        when a read fails in a way a resume cannot cure (or the one resume fails).
        """
        if self._scan is not None:
            return self._next_scanned(max_events)
        if self._ended is not None:
            raise self._ended
        assert self._session is not None, "open() first"
        try:
            read = self._take_read(max_events)
        except PyMongoError as exc:
            if not resumable(exc):
                raise translate(exc) from exc
            self._resume()  # read again after the last token handed out
            return Batch([], self._token, resumed=True)
        self._cursor_id = read.cursor_id
        if len(read.changes) > max_events:
            self._pending.hold(read)  # a read-ahead bigger than the room left: kept for later
            return Batch([], self._token)
        self._token = read.token
        if self._read_ahead and read.changes and self._cursor_id:
            self._pending.send(functools.partial(self._get_more, max_events))
        return self._batch(read.changes)

    def _take_read(self, max_events: int) -> _Read:
        """The pending read (the probe's topped up to a whole read, under the later token that
        covers both), or a getMore of its own."""
        read, probed = self._pending.take()
        if read is None:
            return self._get_more(max_events)
        if probed and len(read.changes) < max_events:
            more = self._get_more(max_events - len(read.changes), await_ms=1)
            return _Read(read.changes + more.changes, more.cursor_id, more.token)
        return read

    def ready(self, timeout: float) -> bool:
        """Whether `next_batch` can return without waiting on the server: a read is held, a scan
        serves documents, the stream ended, or the read-ahead in flight comes back within
        `timeout` seconds. With no read-ahead in flight (after an empty read) the next read is a
        getMore that may wait up to RELAY_MAX_AWAIT_MS: not ready."""
        if self._scan is not None or self._ended is not None:
            return True
        return self._pending.ready(timeout)

    def _batch(self, raw: list[RawBSONDocument]) -> Batch:
        """The changes of one read as a Batch under the current token, cut before a drop, rename
        or invalidate (read once each: relay.mongo.codecs.read_changes)."""
        if not raw:
            return Batch([], self._token)
        changes, other = read_changes(raw)
        if other < 0:
            return Batch(changes, self._token)
        # A drop, rename or invalidate ends the stream: the inserts before it are published and
        # stored first, then the next read raises.
        operation = raw[other]["operationType"]
        self._ended = StreamInvalidatedError(
            f"the outbox collection saw '{operation}' (dropped or renamed?): the change stream ended; "
            "recreate the outbox and reset the checkpoint to continue"
        )
        if other == 0:
            raise self._ended
        return Batch(changes, changes[-1].position)

    def _resume(self) -> None:
        """The spec's resume: once, in the same session, after the token of the last batch
        returned. A failure is the loop's to handle (a restart from the stored checkpoint)."""
        self._kill_cursor()
        try:
            self._aggregate(self._token, None)
        except PyMongoError as exc:
            raise translate(exc) from exc

    def _next_scanned(self, max_events: int) -> Batch:
        assert self._scan is not None
        try:
            changes = list(itertools.islice(self._scan, max_events))
        except PyMongoError as exc:
            raise translate(exc) from exc
        if changes:
            return Batch(changes, None)
        self._scan = None
        return Batch([], self._token)  # the scan is done: the opening token covers it

    def close(self) -> None:
        """Release the cursor and the session; safe to call twice."""
        self._scan = None
        self._ended = None
        self._kill_cursor()
        session, self._session = self._session, None
        if session is not None:
            session.end_session()
        self._pending.shutdown()

"""The shared change stream: one cursor serving every scope this process leads in one database
(or in the cluster), each scope's loop taking its events from its own mailbox (docs/outboxes.md).

Rules (fast tests: tests/unit/test_stream.py; real servers: tests/integration/test_outboxes.py,
tests/integration/test_change_source.py):
- Positions are resume tokens compared by their `_data` (the server's KeyString in hex: its order
  is the stream's, across collections and inside transactions; relay.core.positions).
- Each member (the subscription of one leading session) has a `skip` position: it is handed only
  its own events (its route, relay.mongo.pipeline.StreamPlan) after that position. The cursor
  opens at the earliest start a member needs (`startAtOperationTime` at its cluster time) and
  opens again earlier when a member joins behind it (a rewind); the others skip what they were
  handed. So a member's checkpoint may be any token of any stream over its outbox, and a stored
  token never has to be found by the server (an event token whose event a new filter drops would be).
- A member's events come as batches under the read's post-batch token, which covers them and
  every event before it: once they are delivered, storing it skips nothing (guarantee 1). A read
  with none of its events still advances its idle token (guarantee 7), and only ever forward
  (relay.mongo.mailbox.Mailbox.post): after a rewind, or for a member that joined ahead of the
  cursor, the older reads leave it where it is (else an idle store would move its checkpoint back).
- Reads: behind the oplog's end (the last read was full: a catch-up) the reader reads on while
  every member holds less than one read's worth of events not taken yet, so memory is bounded
  (one slow member slows the others: they share the read). Caught up (the last read was not
  full), it reads again only once every member took all it was handed: at low rates a getMore
  returns at the first new event, so reading on would cost one getMore per event or two, while a
  read sent once the loops took theirs (it runs while they deliver) returns everything written
  meanwhile: at most one read ahead of each loop, as the one-outbox reader had. And after a read
  that returned events, the next one waits RELAY_READ_LINGER_MS (default 10) for more to gather,
  as a producer's linger.ms does: each read and each parcel cost the relay about the same whatever
  their size, so at 500 one-event transactions a second fewer, larger ones cut its CPU per event
  from 436 to 237 us for about 5 ms more at the median (BENCHMARKS.md, issue 44). After an empty
  read (an idle outbox) it does not wait: a lone event is read at once.
- A drop or rename of an outbox ends its members' streams (after the inserts before it); a
  dropDatabase or an invalidate ends every member's.

Recovery bound (tests/unit/test_stream.py and tests/integration/test_change_source.py, with a
`failCommand` failpoint on getMore): a read that fails with a resumable error (relay.mongo.errors.
resumable: a network error, CursorNotFound, or the ResumableChangeStreamError label) reopens the
cursor **once, at once** (no wait), where the last read left it; the members skip what they had
and their next batch says `resumed`. If the read after that reopen fails too (or the reopen
does), before any read succeeds, the error reaches every member's loop, which restarts from its
checkpoint and joins again under relay.core.restarts.RestartPolicy: the first restart after
progress at once, each further one 0.2 s doubling plus up to 0.2 s of jitter, at most
RELAY_RESTART_BACKOFF_MAX_S. So a loop meets at most one reopen per failed read before it sees the
error, the bound pymongo's ChangeStream keeps ("at most one resume" per getMore). The reader does
not run pymongo's ChangeStream (relay.mongo.cursor sends the commands, which pymongo does not
retry): this bound is the only resume, not one on top of the driver's. Any other error reaches
the loops at once (a reopenable one, CappedPositionLost or ChangeStreamFatalError, may do so once
without progress before the relay stops: RestartPolicy.check_reopen).

Who owns what: the reader thread alone owns the cursor, its position and the member table (each
member's route, scope and skip position); a loop reaches the reader only by a join request
(`join`) and its mailbox (relay.mongo.mailbox), which owns everything both threads touch (the
queue, its count, the idle token, the `resumed` flag). A loop leaves by closing its mailbox.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from relay.core.change import Change
from relay.core.errors import HistoryLostError, ServerRefusedError, StreamInvalidatedError, TransientError
from relay.core.partitions import Scope
from relay.core.positions import ClusterTime, StartPoint, Token, position_key, token_cluster_time
from relay.mongo.codecs import change_document, read_changes
from relay.mongo.cursor import Cursor, Read
from relay.mongo.errors import resumable, translate
from relay.mongo.mailbox import Mailbox
from relay.mongo.pipeline import EVERY_ROUTE, StreamPlan

log = logging.getLogger("relay.stream")

PROBE_AWAIT_MS = 1  # the first read after opening: it checks the start point, it need not wait
REOPENS_PER_FAILED_READ = 1  # the recovery bound (module docstring)
_OPEN_ERRORS = (PyMongoError, HistoryLostError, TransientError, StreamInvalidatedError, ServerRefusedError)


@dataclass(eq=False)
class _Member:
    """The reader's record of one member (its thread alone reads and changes it)."""

    scope: Scope
    skip: str  # hand over only events after this position (a token's `_data`)
    mailbox: Mailbox


@dataclass(eq=False)
class _Join:
    """A loop's request to join, placed by the reader: where the member starts and what it learns."""

    scope: Scope
    start: StartPoint
    route: int
    skip: str = ""  # the member's skip position once placed ("" : where the cursor is)
    opening: Token | None = None  # its stored token when it resumes after one
    at: Timestamp | None = None  # where the cursor must be to serve it (None: now)
    done: threading.Event = field(default_factory=threading.Event)
    mailbox: Mailbox | None = None
    error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


def _time(at: ClusterTime) -> Timestamp:
    return Timestamp(at.time, at.inc)


def _key_time(key: str) -> Timestamp:
    at = token_cluster_time({"_data": key})
    assert at is not None, key
    return _time(at)


class SharedStream:
    """One change stream for the scopes of `plan` (see the module docstring)."""

    def __init__(
        self,
        plan: StreamPlan,
        cursor: Callable[[], Cursor],
        read_events: int,
        await_s: float,
        oplog_start: Callable[[], Timestamp],
        linger_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`cursor` makes a fresh cursor of the plan; `read_events` is one read's size and each
        member's queue bound; `await_s` the longest a member waits for events (RELAY_MAX_AWAIT_MS);
        `linger_s` how long, caught up, the read after one that returned events waits for more
        (RELAY_READ_LINGER_MS; the module docstring, "Reads")."""
        self.plan = plan
        self._linger_s = linger_s
        self._monotonic = monotonic
        self._new_cursor = cursor
        self._read_events = read_events
        self._await_s = await_s
        self._oplog_start = oplog_start
        self._cond = threading.Condition()
        # Shared with the loops, under the condition: the join requests and the stop flag.
        self._joins: list[_Join] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        # The reader thread's alone.
        self._members: dict[int, _Member] = {}
        self._server_cursor: Cursor | None = None
        self._position: Token | None = None  # the last post-batch token read
        self._reopened = 0  # reopens after a resumable error since the last read that succeeded
        self._caught_up = False  # the last read was not full: the cursor is at the oplog's end
        self._linger_until = 0.0  # caught up, no read before this time (`monotonic`)

    # ---- the loops' side ----------------------------------------------------------------------------

    def join(self, scope: Scope, start: StartPoint) -> Mailbox:
        """Add `scope`'s session to the stream at `start`; returns its mailbox once the cursor can
        serve it. Raises HistoryLostError when that point left the oplog, or the error opening it met."""
        join = _Join(scope, start, self.plan.route(scope))
        with self._cond:
            if self._closed:
                raise TransientError("the change stream is closed (the relay is stopping)")
            self._joins.append(join)
            self._start_thread()
            self._cond.notify_all()
        join.done.wait()
        if join.error is not None:
            raise join.error
        assert join.mailbox is not None
        return join.mailbox

    @property
    def read_to(self) -> Token | None:
        """The post-batch token of the reader's last read (None while no cursor is open): how far
        the stream has read. The reader thread alone writes it; any thread may read it (one
        reference, never half written) to observe the reader, as the tests do: nothing decides
        on it outside the reader."""
        return self._position

    def close(self) -> None:
        """Stop the reader and release the cursor (the process stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            joins, self._joins = self._joins, []
        for join in joins:
            join.fail(TransientError("the change stream is closed (the relay is stopping)"))

    # ---- the reader (its own thread) ----------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            name = f"relay-stream-{self.plan.database or 'cluster'}"
            self._thread = threading.Thread(target=self._run, daemon=True, name=name)
            self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while (wait := self._until_turn()) != 0:
                        self._cond.wait(wait)
                    if self._closed:
                        return
                    joins, self._joins = self._joins, []
                try:
                    self._pass(joins)
                except Exception as exc:
                    log.exception("the change stream reader failed; its loops restart")
                    error = TransientError(f"the change stream reader failed: {exc}")
                    for j in joins:
                        if not j.done.is_set():
                            j.fail(error)
                    self._fail_members(error)
        finally:
            self._release_cursor()

    def _pass(self, joins: list[_Join]) -> None:
        """One turn of the reader: admit the joining members, else read once, else (only standbys
        here) hold no cursor on the server."""
        if joins:
            self._admit(joins)
        elif self._members:
            self._read_once()
        else:
            self._release_cursor()

    def _until_turn(self) -> float | None:
        """How long the reader waits before its next turn (it runs under the condition, in the
        reader): 0, none; None, until a loop or a join notifies it; else what is left of the linger,
        read from the clock once (a linger ending between two readings must not become a wait for
        a notification that never comes: the loops wait for events, not the other way round)."""
        if self._closed or self._joins:
            return 0
        for route in [r for r, m in self._members.items() if m.mailbox.closed]:
            del self._members[route]  # the member left
        if not self._members:
            return 0 if self._server_cursor is not None else None  # to release it
        bound = 1 if self._caught_up else self._read_events  # the module docstring, "Reads"
        if any(m.mailbox.queued >= bound for m in self._members.values()):
            return None
        left = self._linger_until - self._monotonic()
        return left if left > 0 else 0

    def _release_cursor(self) -> None:
        cursor, self._server_cursor, self._position = self._server_cursor, None, None
        if cursor is not None:
            cursor.close()

    def _admit(self, joins: list[_Join]) -> None:
        """Place each joining member (its skip position, where the cursor must be for it), open the
        cursor (again, earlier) if one of them needs it, then add them; the probe read after an
        open goes to every member, the joining ones too."""
        placed = [j for j in joins if self._place(j)]
        if not placed:
            return
        probe = None
        if self._server_cursor is None or any(j.at is not None and self._behind(j) for j in placed):
            probe = self._open(placed)
            if probe is None:
                return
        for j in placed:
            self._enter(j)
        if probe is not None:
            self._dispatch(probe)

    def _place(self, join: _Join) -> bool:
        """Set the member's skip position and where the cursor must be for it; False (and the join
        failed) when that point has left the oplog."""
        start = join.start
        if start.resume_after is not None:
            at = token_cluster_time(start.resume_after)
            join.skip, join.opening = str(start.resume_after["_data"]), start.resume_after
        elif start.at_time is not None or start.oplog_start:
            at = start.at_time if start.at_time is not None else _cluster_time(self._oplog_start())
            join.skip = position_key(at)
        else:
            at = None  # now: after the cursor's position, or where it opens
        if at is None:
            return True
        join.at = _time(at)
        try:
            lost = join.at < self._oplog_start()
        except PyMongoError as exc:
            join.fail(translate(exc))
            return False
        if lost:
            join.fail(_history_lost(join.scope))
        return not lost

    def _behind(self, join: _Join) -> bool:
        """Whether the cursor has already read past where `join`'s member starts."""
        return self._position is not None and join.skip < str(self._position["_data"])

    def _enter(self, join: _Join) -> None:
        """Add a placed member at the cursor's position: its opening token is its stored one, else
        that position (which covers nothing it is handed), its skip position likewise."""
        assert self._position is not None, "the cursor is open"
        opening = join.opening or self._position
        mailbox = Mailbox(join.scope, opening, self._cond, self._await_s)
        with self._cond:
            self._members[join.route] = _Member(join.scope, join.skip or str(self._position["_data"]), mailbox)
        join.mailbox = mailbox
        join.done.set()

    def _open(self, placed: list[_Join]) -> Read | None:
        """Open the cursor at the earliest point a member or a joining one needs (now when none
        needs a point), and probe it with a first read; returns the probe. If it fails, the joins
        fail (HistoryLostError only for the ones at the point that left the oplog, the others
        retry), the result is None, and the members are served from where they are by the next read."""
        points = [_key_time(m.skip) for m in self._members.values() if m.skip]
        points += [j.at for j in placed if j.at is not None]
        at = min(points) if points else None
        self._release_cursor()
        cursor = self._new_cursor()
        try:
            opening = cursor.open(at)
            probe = cursor.read(self._read_events, PROBE_AWAIT_MS)
        except _OPEN_ERRORS as exc:
            cursor.close()
            error = translate(exc) if isinstance(exc, PyMongoError) else exc
            for j in placed:
                j.fail(_open_failure(error, j, at))
            return None
        self._server_cursor, self._position, self._reopened = cursor, opening, 0
        return probe

    def _read_once(self) -> None:
        cursor = self._server_cursor
        if cursor is None:
            skips = [m.skip for m in self._members.values() if m.skip]
            self._reopen(_key_time(min(skips)) if skips else None)
            return
        try:
            read = cursor.read(self._read_events)
        except PyMongoError as exc:
            self._recover(exc)
            return
        self._reopened = 0
        self._dispatch(read)
        if not cursor.alive:
            self._release_cursor()

    def _recover(self, exc: PyMongoError) -> None:
        """After a failed read: reopen where the cursor was, within the recovery bound (module
        docstring), else hand the error to every member."""
        if not resumable(exc) or self._reopened >= REOPENS_PER_FAILED_READ:
            self._fail_members(translate(exc))
            return
        self._reopened += 1
        log.info("change stream of %s resumed after: %s", self.plan.database or "the cluster", exc)
        for m in self._members.values():
            m.mailbox.mark_resumed()
        self._reopen(_cluster_time_of(self._position))

    def _reopen(self, at: Timestamp | None) -> None:
        """Open the cursor again at `at` (the spec's resume: members skip what they had)."""
        self._release_cursor()
        cursor = self._new_cursor()
        try:
            self._position = cursor.open(at)
            self._server_cursor = cursor
        except _OPEN_ERRORS as exc:
            cursor.close()
            self._fail_members(translate(exc) if isinstance(exc, PyMongoError) else exc)

    def _fail_members(self, error: BaseException) -> None:
        """Hand `error` to every member (each loop restarts from its checkpoint and joins again) and
        hold no cursor: the next member to join opens one."""
        with self._cond:
            for m in self._members.values():
                m.mailbox.fail(error)
            self._members.clear()
        self._reopened = 0
        self._release_cursor()

    def _dispatch(self, read: Read) -> None:
        """Hand each member its events of `read` under the read's token (see the module docstring)."""
        events, ended = self._split(read.changes)
        key = str(read.token["_data"])
        self._caught_up = len(read.changes) < self._read_events  # the probe's read counts too
        lingers = self._caught_up and bool(read.changes)  # the module docstring, "Reads"
        self._linger_until = self._monotonic() + self._linger_s if lingers else 0.0
        with self._cond:  # one pass over every mailbox: a member sees a read whole or not at all
            for route, member in list(self._members.items()):
                mine = _after(events.get(route, []), member.skip)
                end = ended.get(route) or ended.get(EVERY_ROUTE)
                if end is not None:
                    member.mailbox.end(mine, end)
                    del self._members[route]
                    continue
                member.mailbox.post(mine, read.token)
                member.skip = max(member.skip, key)
            self._position = read.token

    def _split(self, raw: list[bytes]) -> tuple[dict[int, list[Change]], dict[int, StreamInvalidatedError]]:
        """The inserts of a read by route, and the routes whose stream a drop, rename, dropDatabase
        or invalidate ended (EVERY_ROUTE: all of them); inserts after a route's end are not its."""
        events: dict[int, list[Change]] = collections.defaultdict(list)
        ended: dict[int, StreamInvalidatedError] = {}
        rest = raw
        while rest:
            routes: list[int] | None = [] if self.plan.routed else None
            changes, other = read_changes(rest, routes)
            if routes is None:  # one scope: every insert is its own (until its stream ends)
                if not ended:
                    events[0].extend(changes)
            else:
                for change, route in zip(changes, routes, strict=True):
                    if route not in ended and EVERY_ROUTE not in ended:
                        events[route].append(change)
            if other < 0:
                break
            ending = change_document(rest[other])
            ns = ending.get("ns") or {}
            for route in self.plan.routes_of(ns.get("db"), ns.get("coll")):
                ended.setdefault(route, _invalidated(ending))
            rest = rest[other + 1 :]
        return events, ended


def _after(changes: list[Change], skip: str) -> list[Change]:
    """The changes after position `skip` (they are in stream order: only a prefix can be before it)."""
    if not changes or changes[0].position["_data"] > skip:
        return changes
    return [c for c in changes if c.position["_data"] > skip]


def _cluster_time(ts: Timestamp) -> ClusterTime:
    return ClusterTime(ts.time, ts.inc)


def _cluster_time_of(token: Token | None) -> Timestamp | None:
    at = token_cluster_time(token)
    return None if at is None else _time(at)


def _open_failure(error: BaseException, join: _Join, at: Timestamp | None) -> BaseException:
    """What a join learns when the cursor failed to open: history lost only for the join at the
    point that left the oplog (the others retry), a transient error as one, and any other error
    (a reopenable or fatal one) as itself, so its action holds."""
    if isinstance(error, HistoryLostError):
        return _history_lost(join.scope) if join.at == at else TransientError(f"opening the change stream: {error}")
    if isinstance(error, TransientError):
        return TransientError(f"opening the change stream: {error}")
    return error


def _history_lost(scope: Scope) -> HistoryLostError:
    return HistoryLostError.of(f"the stored checkpoint of {scope}")


def _invalidated(change: Any) -> StreamInvalidatedError:
    ns = change.get("ns") or {}
    where = ".".join(str(p) for p in (ns.get("db"), ns.get("coll")) if p)
    operation = change.get("operationType")
    return StreamInvalidatedError(
        f"the outbox collection {where} saw '{operation}' (dropped or renamed?): its change stream ended; "
        "recreate the outbox and reset the checkpoint to continue"
    )

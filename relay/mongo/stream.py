"""The shared change stream: one cursor serving every scope this process leads in one database
(or in the cluster), handed to each scope's loop as its own change source (docs/outboxes.md).

Rules (fast tests: tests/unit/test_stream.py; real servers: tests/integration/test_outboxes.py):
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
  with none of its events still advances its idle token (guarantee 7), and only ever forward: after
  a rewind, or for a member that joined ahead of the cursor, the older reads leave it where it is
  (else an idle store would move that member's checkpoint back).
- Memory is bounded: the reader reads on only while every member holds less than one read's worth
  of events not taken yet (one slow member slows the others: they share the read).
- A resumable error opens the cursor again where it was (members skip what they had, their next
  batch says `resumed`); any other error is handed to every member, which restarts from its
  checkpoint and joins again. A drop or rename of an outbox ends its members' streams (after the
  inserts before it); a dropDatabase or an invalidate ends every member's.

One reader thread runs the cursor; the members' loops only take from their queues.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from relay.core.change import Batch, Change
from relay.core.errors import HistoryLostError, ServerRefusedError, StreamInvalidatedError, TransientError
from relay.core.partitions import Scope
from relay.core.positions import ClusterTime, StartPoint, Token, newer, position_key, token_cluster_time
from relay.mongo.codecs import read_changes
from relay.mongo.cursor import Cursor, Read
from relay.mongo.errors import resumable, translate
from relay.mongo.pipeline import StreamPlan

log = logging.getLogger("relay.stream")

PROBE_AWAIT_MS = 1  # the first read after opening: it checks the start point, it need not wait


@dataclass(eq=False)
class _Member:
    """One leading session's place in the stream."""

    scope: Scope
    route: int
    skip: str  # hand over only events after this position (a token's `_data`)
    opening: Token | None = None  # a token covering nothing the member is handed: its position at joining
    tail: Token | None = None  # covers everything dispatched to it
    queue: collections.deque[Batch | BaseException] = field(default_factory=collections.deque)
    queued: int = 0  # events in `queue`
    resumed: bool = False  # the cursor was resumed since its last batch


@dataclass(eq=False)
class _Join:
    member: _Member
    start: StartPoint
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    at: Timestamp | None = None  # where the cursor must be to serve it (None: now)

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
    ) -> None:
        """`cursor` makes a fresh cursor of the plan; `read_events` is one read's size and each
        member's queue bound; `await_s` the longest a member waits for events (RELAY_MAX_AWAIT_MS)."""
        self.plan = plan
        self._new_cursor = cursor
        self._read_events = read_events
        self._await_s = await_s
        self._oplog_start = oplog_start
        self._cond = threading.Condition()
        self._members: dict[int, _Member] = {}
        self._joins: list[_Join] = []
        self._server_cursor: Cursor | None = None
        self._position: Token | None = None  # the last post-batch token read
        self._thread: threading.Thread | None = None
        self._closed = False

    # ---- the members' side (their loops' threads) -------------------------------------------------

    def join(self, scope: Scope, start: StartPoint) -> _Member:
        """Add `scope`'s session to the stream at `start`; returns once the cursor can serve it.
        Raises HistoryLostError when that point left the oplog, or the error opening it met."""
        join = _Join(_Member(scope, self.plan.route(scope), ""), start)
        with self._cond:
            if self._closed:
                raise TransientError("the change stream is closed (the relay is stopping)")
            self._joins.append(join)
            self._start_thread()
            self._cond.notify_all()
        join.done.wait()
        if join.error is not None:
            raise join.error
        return join.member

    def leave(self, member: _Member) -> None:
        """Remove a session from the stream (its loop closed it); safe to call twice."""
        with self._cond:
            if self._members.get(member.route) is member:
                del self._members[member.route]
            self._cond.notify_all()

    def take(self, member: _Member, max_events: int) -> Batch:
        """The member's next batch of at most `max_events` events, waiting up to RELAY_MAX_AWAIT_MS
        for one; an empty batch under its idle token when there is none. Raises what ended its
        stream (the error the reader met, or StreamInvalidatedError).

        Everything queued that fits is taken at once: the reads queued while the loop delivered
        are joined into one batch under the last one's token (a steady stream of small reads,
        one per getMore, would otherwise cost the loop a delivery and a checkpoint each, and a
        loop that falls behind never catches up)."""
        with self._cond:
            deadline = time.monotonic() + self._await_s
            while not member.queue and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            resumed, member.resumed = member.resumed, False
            if not member.queue:
                return Batch([], member.tail, resumed=resumed)
            head = member.queue[0]
            if isinstance(head, BaseException):
                member.queue.popleft()
                raise head
            if len(head.changes) <= max_events:
                member.queue.popleft()
                batch = _join(head, member.queue, max_events)
            else:  # the part that fits, under its last event's own token
                batch = Batch(head.changes[:max_events], head.changes[max_events - 1].position)
                head.changes = head.changes[max_events:]
            member.queued -= len(batch.changes)
            self._cond.notify_all()
            batch.resumed = batch.resumed or resumed
            return batch

    def ready(self, member: _Member, timeout: float) -> bool:
        """Whether `take` can return at once, waiting up to `timeout` seconds for it."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(member.queue), max(0.0, timeout))

    def close(self) -> None:
        """Stop the reader and release the cursor (the process stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        for join in self._joins:
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
                    self._cond.wait_for(self._has_work)
                    if self._closed:
                        return
                    joins, self._joins = self._joins, []
                    reading = bool(self._members)
                try:
                    if joins:
                        self._admit(joins)
                    elif reading:
                        self._read_once()
                    else:
                        self._release_cursor()  # only standbys here: hold no cursor on the server
                except Exception as exc:
                    log.exception("the change stream reader failed; its loops restart")
                    error = TransientError(f"the change stream reader failed: {exc}")
                    for j in joins:
                        if not j.done.is_set():
                            j.fail(error)
                    self._fail_members(error)
                    self._release_cursor()
        finally:
            self._release_cursor()

    def _has_work(self) -> bool:
        if self._closed or self._joins:
            return True
        if not self._members:
            return self._server_cursor is not None  # to release it
        return all(m.queued < self._read_events for m in self._members.values())

    def _release_cursor(self) -> None:
        cursor, self._server_cursor, self._position = self._server_cursor, None, None
        if cursor is not None:
            cursor.close()

    def _admit(self, joins: list[_Join]) -> None:
        """Place each joining member (its skip position, where the cursor must be for it), open the
        cursor (again, earlier) if one of them needs it, then add them."""
        placed = [j for j in joins if self._place(j)]
        if not placed:
            return
        if self._server_cursor is None or any(j.at is not None and self._behind(j) for j in placed):
            placed = self._open(placed)
        with self._cond:
            for j in placed:
                member = j.member
                if member.opening is None:  # now, or a time the cursor has not reached yet
                    assert self._position is not None
                    member.opening = self._position
                    member.skip = member.skip or str(self._position["_data"])
                member.tail = member.tail or member.opening
                self._members[member.route] = member
                j.done.set()
            self._cond.notify_all()

    def _place(self, join: _Join) -> bool:
        """Set the member's skip position and where the cursor must be for it; False (and the join
        failed) when that point has left the oplog."""
        start, member = join.start, join.member
        if start.resume_after is not None:
            at = token_cluster_time(start.resume_after)
            member.skip, member.opening = str(start.resume_after["_data"]), start.resume_after
        elif start.at_time is not None or start.oplog_start:
            at = start.at_time if start.at_time is not None else _cluster_time(self._oplog_start())
            member.skip = position_key(at)
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
            join.fail(_history_lost(member.scope))
        return not lost

    def _behind(self, join: _Join) -> bool:
        """Whether the cursor has already read past where `join`'s member starts."""
        return self._position is not None and join.member.skip < str(self._position["_data"])

    def _open(self, placed: list[_Join]) -> list[_Join]:
        """Open the cursor at the earliest point a member or a joining one needs (now when none
        needs a point), and probe it with a first read; returns the joins it serves. If it fails,
        they fail (HistoryLostError only for the ones at the point that left the oplog, the others
        retry), and the members are served from where they are by the next read."""
        with self._cond:
            points = [_key_time(m.skip) for m in self._members.values() if m.skip]
        points += [j.at for j in placed if j.at is not None]
        at = min(points) if points else None
        self._release_cursor()
        cursor = self._new_cursor()
        try:
            opening = cursor.open(at)
            probe = cursor.read(self._read_events, PROBE_AWAIT_MS)
        except (PyMongoError, HistoryLostError, TransientError, StreamInvalidatedError, ServerRefusedError) as exc:
            cursor.close()
            error = translate(exc) if isinstance(exc, PyMongoError) else exc
            for j in placed:
                j.fail(_open_failure(error, j, at))
            return []
        self._server_cursor, self._position = cursor, opening
        with self._cond:  # the probe's events go to the members, the joining ones too
            for j in placed:
                member = j.member
                member.opening = member.opening or opening  # at or before where it starts
                member.tail = member.tail or member.opening
                member.skip = member.skip or str(opening["_data"])
                self._members[member.route] = member
        self._dispatch(probe)
        return placed

    def _read_once(self) -> None:
        cursor = self._server_cursor
        if cursor is None:
            with self._cond:
                skips = [m.skip for m in self._members.values() if m.skip]
            self._reopen(_key_time(min(skips)) if skips else None)
            return
        try:
            read = cursor.read(self._read_events)
        except PyMongoError as exc:
            if not resumable(exc):
                self._fail_members(translate(exc))
                self._release_cursor()
                return
            log.info("change stream of %s resumed after: %s", self.plan.database or "the cluster", exc)
            with self._cond:
                for m in self._members.values():
                    m.resumed = True
            self._reopen(_cluster_time_of(self._position))
            return
        self._dispatch(read)
        if not cursor.alive:
            self._release_cursor()

    def _reopen(self, at: Timestamp | None) -> None:
        """Open the cursor again at `at` (the spec's resume: members skip what they had)."""
        self._release_cursor()
        cursor = self._new_cursor()
        try:
            self._position = cursor.open(at)
            self._server_cursor = cursor
        except (PyMongoError, HistoryLostError, TransientError, StreamInvalidatedError, ServerRefusedError) as exc:
            cursor.close()
            self._fail_members(translate(exc) if isinstance(exc, PyMongoError) else exc)

    def _fail_members(self, error: BaseException) -> None:
        """Hand `error` to every member (each loop restarts from its checkpoint and joins again)."""
        with self._cond:
            for m in self._members.values():
                m.queue.append(error)
            self._members.clear()
            self._cond.notify_all()

    def _dispatch(self, read: Read) -> None:
        """Hand each member its events of `read` under the read's token (see the module docstring)."""
        events, ended = self._split(read.changes)
        key = str(read.token["_data"])
        with self._cond:
            for route, member in list(self._members.items()):
                mine = _after(events.get(route, []), member.skip)
                end = ended.get(route) or ended.get(-1)
                if end is not None:
                    if mine:
                        member.queue.append(Batch(mine, mine[-1].position))
                    member.queue.append(end)
                    del self._members[route]
                    continue
                if mine:
                    member.queue.append(Batch(mine, read.token))
                    member.queued += len(mine)
                if member.tail is None or newer(read.token, member.tail):
                    member.tail = read.token
                member.skip = max(member.skip, key)
            self._position = read.token
            self._cond.notify_all()

    def _split(self, raw: list[Any]) -> tuple[dict[int, list[Change]], dict[int, StreamInvalidatedError]]:
        """The inserts of a read by route, and the routes whose stream a drop, rename, dropDatabase
        or invalidate ended (-1: every route); inserts after a route's end are not its."""
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
                    if route not in ended and -1 not in ended:
                        events[route].append(change)
            if other < 0:
                break
            for route in self._ended_routes(rest[other]):
                ended.setdefault(route, _invalidated(rest[other]))
            rest = rest[other + 1 :]
        return events, ended

    def _ended_routes(self, change: Any) -> list[int]:
        """The routes a drop, rename, dropDatabase or invalidate ends (-1: all)."""
        if self.plan.collection is not None:
            return [-1]  # the one outbox of a collection's stream
        ns = change.get("ns") or {}
        database, collection = ns.get("db"), ns.get("coll")
        if collection is None and (self.plan.database is not None or database is None):
            return [-1]  # the database's stream ended
        n = self.plan.partitions
        return [
            i * n + k
            for i, o in enumerate(self.plan.outboxes)
            if o == f"{database}.{collection}" or (collection is None and o.partition(".")[0] == database)
            for k in range(n)
        ]


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


def _join(batch: Batch, queue: collections.deque[Batch | BaseException], max_events: int) -> Batch:
    """`batch` and the whole batches queued after it that fit in `max_events`, as one batch under
    the last one's token (it covers them all); stops at an error or a batch that does not fit."""
    changes, token, resumed = list(batch.changes), batch.token, batch.resumed
    while queue and isinstance(nxt := queue[0], Batch) and len(changes) + len(nxt.changes) <= max_events:
        queue.popleft()
        changes += nxt.changes
        token, resumed = nxt.token, resumed or nxt.resumed
    if len(changes) == len(batch.changes):
        return batch
    return Batch(changes, token, resumed=resumed)


def _open_failure(error: BaseException, join: _Join, at: Timestamp | None) -> BaseException:
    """What a join learns when the cursor failed to open: history lost only for the join at the
    point that left the oplog (the others retry), a transient error as one, and any other error
    (a reopenable or fatal one) as itself, so its action holds."""
    if isinstance(error, HistoryLostError):
        return (
            _history_lost(join.member.scope) if join.at == at else TransientError(f"opening the change stream: {error}")
        )
    if isinstance(error, TransientError):
        return TransientError(f"opening the change stream: {error}")
    return error


def _history_lost(scope: Scope) -> HistoryLostError:
    return HistoryLostError(
        f"the stored checkpoint of {scope} is no longer in the oplog (ChangeStreamHistoryLost): events "
        "between it and the oldest oplog entry cannot be read from the change stream; see the README runbook "
        "'history lost'"
    )


def _invalidated(change: Any) -> StreamInvalidatedError:
    ns = change.get("ns") or {}
    where = ".".join(str(p) for p in (ns.get("db"), ns.get("coll")) if p)
    operation = change.get("operationType")
    return StreamInvalidatedError(
        f"the outbox collection {where} saw '{operation}' (dropped or renamed?): its change stream ended; "
        "recreate the outbox and reset the checkpoint to continue"
    )


class Subscription:
    """One leading session's change source over a shared stream (relay.core.boundaries.ChangeSource).

    `scan` lists the scope's documents for a rescan (relay.mongo.rescan). Not thread-safe: one loop
    uses it."""

    def __init__(self, stream: SharedStream, scope: Scope, scan: Callable[[], Iterator[Change]]) -> None:
        self._stream = stream
        self._scope = scope
        self._scan_documents = scan
        self._member: _Member | None = None
        self._handed: Token | None = None  # covers every change handed out so far
        self._scan: Iterator[Change] | None = None

    def open(self, start: StartPoint) -> None:
        """Join the stream at `start`; raises HistoryLostError when that point left the oplog."""
        self.close()
        self._member = self._stream.join(self._scope, start)
        self._handed = self._member.opening

    def rescan(self) -> None:
        """Take the stream's position now, then serve every document of the scope (without a token),
        then an empty batch under that position, then the stream from it. The scope is out of the
        shared stream while it scans, so a long scan slows no other scope."""
        self.open(StartPoint())
        opening = self._handed
        if opening is None:
            raise TransientError("no opening token for the stream before the rescan; retrying")
        self._leave()
        self._scan = self._scan_documents()

    @property
    def token(self) -> Token | None:
        """The token covering every change handed out so far (the opening one right after `open`)."""
        return self._handed

    def next_batch(self, max_events: int) -> Batch:
        """The scope's next changes, at most `max_events` (see SharedStream.take)."""
        if self._scan is not None:
            return self._next_scanned(max_events)
        assert self._member is not None, "open() first"
        batch = self._stream.take(self._member, max_events)
        self._handed = batch.token or self._handed
        return batch

    def ready(self, timeout: float) -> bool:
        if self._scan is not None:
            return True
        return self._member is not None and self._stream.ready(self._member, timeout)

    def _next_scanned(self, max_events: int) -> Batch:
        assert self._scan is not None
        try:
            changes = list(itertools.islice(self._scan, max_events))
        except PyMongoError as exc:
            raise translate(exc) from exc
        if changes:
            return Batch(changes, None)
        self._scan = None
        assert self._handed is not None
        self._member = self._stream.join(self._scope, StartPoint(resume_after=self._handed))
        return Batch([], self._handed)  # the scan is done: the opening token covers it

    def _leave(self) -> None:
        member, self._member = self._member, None
        if member is not None:
            self._stream.leave(member)

    def close(self) -> None:
        """Leave the stream; safe to call twice."""
        self._scan = None
        self._leave()


def subscriptions(
    stream: SharedStream, scope: Scope, scan: Callable[[], Iterator[Change]]
) -> Callable[[], Subscription]:
    """The change source factory of `scope`'s loop: a fresh subscription per leading session."""
    return functools.partial(Subscription, stream, scope, scan)

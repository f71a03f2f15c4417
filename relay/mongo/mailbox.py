"""One member's mailbox: what the shared reader hands one leading session, and the only state the
reader thread and that session's loop both touch (relay.mongo.shared_reader).

The reader posts (`post`, `end`, `fail`, `mark_resumed`); the loop takes (`take`, `ready`) and
closes. Every method holds the stream's condition (one lock for the stream, so the reader's
pass over all mailboxes is atomic), and each field is changed only here:
- `queue` holds batches in stream order, then at most one error (what ended the member's stream);
- `queued` counts the events in the queue's batches; the reader reads on only while every open
  mailbox holds less than one read's worth;
- `tail` covers every event posted, and only ever moves forward (an idle batch is handed under
  it, so an idle store never moves a checkpoint back);
- `resumed` says the cursor was reopened since the last batch taken.
"""

from __future__ import annotations

import collections
import threading
import time

from relay.core.change import Batch, Change
from relay.core.partitions import Scope
from relay.core.positions import Token, newer


class Mailbox:
    """The batches of one member of a shared stream (see the module docstring). `opening` is a
    token covering nothing the member is handed: its position when it joined."""

    def __init__(self, scope: Scope, opening: Token, cond: threading.Condition, await_s: float) -> None:
        self.scope = scope
        self.opening = opening
        self._cond = cond
        self._await_s = await_s
        self._queue: collections.deque[Batch | BaseException] = collections.deque()
        self._queued = 0
        self._tail = opening
        self._resumed = False
        self._closed = False

    # ---- the reader's side ------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """The events posted and not taken yet."""
        with self._cond:
            return self._queued

    @property
    def closed(self) -> bool:
        """Whether the member left (the reader drops it on its next pass)."""
        with self._cond:
            return self._closed

    def post(self, changes: list[Change], token: Token) -> None:
        """Hand `changes` (possibly none) under the read's post-batch `token`, which covers them;
        the idle token moves to `token` only if it is newer."""
        with self._cond:
            if changes:
                self._queue.append(Batch(changes, token))
                self._queued += len(changes)
            if newer(token, self._tail):
                self._tail = token
            self._cond.notify_all()

    def end(self, changes: list[Change], error: BaseException) -> None:
        """Hand the last `changes` of the member's stream under the last one's own token, then the
        `error` that ended it (a drop, rename, dropDatabase or invalidate)."""
        with self._cond:
            if changes:
                self._queue.append(Batch(changes, changes[-1].position))
            self._queue.append(error)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Hand `error` after what is queued (the loop restarts from its checkpoint)."""
        with self._cond:
            self._queue.append(error)
            self._cond.notify_all()

    def mark_resumed(self) -> None:
        """The cursor was reopened: the member's next batch says `resumed`."""
        with self._cond:
            self._resumed = True

    # ---- the member's side (its loop's thread) ---------------------------------------------------

    def take(self, max_events: int) -> Batch:
        """The member's next batch of at most `max_events` events, waiting up to RELAY_MAX_AWAIT_MS
        for one; an empty batch under its idle token when there is none. Raises what ended its
        stream (the error the reader met, or StreamInvalidatedError).

        Everything queued that fits is taken at once: the reads queued while the loop delivered
        are joined into one batch under the last one's token (a steady stream of small reads,
        one per getMore, would otherwise cost the loop a parcel and a checkpoint each, and a
        loop that falls behind never catches up)."""
        with self._cond:
            deadline = time.monotonic() + self._await_s
            while not self._queue and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            resumed, self._resumed = self._resumed, False
            if not self._queue:
                return Batch([], self._tail, resumed=resumed)
            head = self._queue[0]
            if isinstance(head, BaseException):
                self._queue.popleft()
                raise head
            if len(head.changes) <= max_events:
                self._queue.popleft()
                batch = _join(head, self._queue, max_events)
            else:  # the part that fits, under its last event's own token
                batch = Batch(head.changes[:max_events], head.changes[max_events - 1].position)
                head.changes = head.changes[max_events:]
            self._queued -= len(batch.changes)
            self._cond.notify_all()  # the reader may read on
            batch.resumed = batch.resumed or resumed
            return batch

    def ready(self, timeout: float) -> bool:
        """Whether `take` can return at once, waiting up to `timeout` seconds for it."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._queue), max(0.0, timeout))

    def close(self) -> None:
        """Leave the stream: nothing more is posted that counts; safe to call twice."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


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

"""One leading session's change source over the process's shared stream
(relay.core.boundaries.ChangeSource; relay.mongo.shared_reader), with its rescan.

A subscription joins the shared stream at the session's start point and takes its batches from
its mailbox (relay.mongo.mailbox). A rescan (RELAY_ON_HISTORY_LOST=rescan, relay.mongo.rescan)
takes the stream's position now, leaves the stream while it serves the scope's documents (so a
long scan slows no other scope), then an empty batch under that position, then joins again from it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

from pymongo.errors import PyMongoError

from relay.core.change import Batch, Change
from relay.core.errors import TransientError
from relay.core.partitions import Scope
from relay.core.positions import StartPoint, Token
from relay.mongo.errors import translate
from relay.mongo.mailbox import Mailbox
from relay.mongo.shared_reader import SharedStream


class Subscription:
    """One leading session's change source over a shared stream (relay.core.boundaries.ChangeSource).

    `scan` lists the scope's documents for a rescan (relay.mongo.rescan). Not thread-safe: one loop
    uses it."""

    def __init__(self, stream: SharedStream, scope: Scope, scan: Callable[[], Iterator[Change]]) -> None:
        self._stream = stream
        self._scope = scope
        self._scan_documents = scan
        self._member: Mailbox | None = None
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
        if self._handed is None:
            raise TransientError("no opening token for the stream before the rescan; retrying")
        self._leave()
        self._scan = self._scan_documents()

    @property
    def token(self) -> Token | None:
        """The token covering every change handed out so far (the opening one right after `open`)."""
        return self._handed

    def next_batch(self, max_events: int) -> Batch:
        """The scope's next changes, at most `max_events` (see relay.mongo.mailbox.Mailbox.take)."""
        if self._scan is not None:
            return self._next_scanned(max_events)
        assert self._member is not None, "open() first"
        batch = self._member.take(max_events)
        self._handed = batch.token or self._handed
        return batch

    def ready(self, timeout: float) -> bool:
        if self._scan is not None:
            return True
        return self._member is not None and self._member.ready(timeout)

    @property
    def queued(self) -> int:
        """The events the reader handed this session and it has not taken yet (0 before `open`)."""
        return 0 if self._member is None else self._member.queued

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
            member.close()

    def close(self) -> None:
        """Leave the stream; safe to call twice."""
        self._scan = None
        self._leave()


def subscriptions(
    stream: SharedStream, scope: Scope, scan: Callable[[], Iterator[Change]]
) -> Callable[[], Subscription]:
    """The change source factory of `scope`'s loop: a fresh subscription per leading session."""
    return functools.partial(Subscription, stream, scope, scan)

"""Where a new leading session opens the change stream: one decision, `resume()` (pure, no I/O).

Its inputs are the MongoDB checkpoint read with the lease (relay.mongo.lease: the token, the
pipeline fingerprint stored beside it, the RELAY_DELIVERY of the relay that stored it, and a
partition's seed `startAtClusterTime` after a change of RELAY_PARTITIONS), the newest committed
offsets record of the lease (relay.kafka.offsets_record; read only where the table needs it), and
the settings (`Rules`). Its result (`Resume`) says where to open, what to do if that point has left
the oplog, what to store once open, and whether to forget a stale offsets record first. The
Kafka side only supplies the record and carries out the forgetting; the loop (relay.core.loop)
applies the result.

Why the newer of checkpoint and record: in exactly-once mode every Kafka transaction also writes
the token covering it to the offsets topic; the MongoDB checkpoint is written after each commit.
It lags the record by at most the transactions of one RELAY_CHECKPOINT_INTERVAL_MS (a crash or a
fence between the commit and the next stored checkpoint: relay.core.coalescer), and is
ahead of it only when something else stored it (an idle heartbeat, which covers no new event; an
at-least-once run after an exactly-once one). Resuming after either loses nothing; after the
newer one repeats nothing. The MongoDB checkpoint alone decides whether there is a position at
all: after `checkpoint reset` (no token) the relay starts at RELAY_START_AT, whatever the offsets
topic holds, and an exactly-once leader forgets that record (a tombstone) so that it can never be
taken for the new lineage's checkpoint.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from relay.core.config import EXACTLY_ONCE, start_at_time
from relay.core.errors import PipelineMismatchError
from relay.core.positions import Checkpoint, ClusterTime, StartPoint, Token, newer, short_token


class Committed(Protocol):
    """The newest committed offsets record of a lease (relay.kafka.offsets_record.OffsetsRecord)."""

    @property
    def lease_id(self) -> str: ...
    @property
    def token(self) -> Token: ...
    @property
    def fingerprint(self) -> str: ...


class IfLost(enum.Enum):
    """What the loop does when the point it opens at has left the oplog (HistoryLostError)."""

    STOP = "stop"  # raise it: the relay stops, naming the lost checkpoint (guarantee 5)
    RESCAN = "rescan"  # open at "now" and re-publish every outbox document (relay.mongo.rescan)
    RETRY = "retry"  # the oldest entry rolled over while opening at it: restart and open again


class Store(enum.Enum):
    """What the loop stores at once, once the stream is open: nothing; the opening token (no
    checkpoint, and not rescanned: a crash before the first batch cannot move the start later); or
    the offsets record's token it resumed after, newer than the checkpoint (`status` shows it)."""

    NOTHING = "nothing"
    OPENING = "opening"
    RESUMED = "resumed"


@dataclass(frozen=True)
class Rules:
    """The settings the decision reads: the pipeline's fingerprint, RELAY_DELIVERY,
    RELAY_START_AT, RELAY_ON_HISTORY_LOST, and RELAY_OFFSETS_TOPIC (named in errors)."""

    fingerprint: str
    delivery: str
    start_at: str
    on_history_lost: str
    offsets_topic: str

    @property
    def if_lost(self) -> IfLost:
        return IfLost(self.on_history_lost)


@dataclass(frozen=True)
class Resume:
    """Where to open the stream (`start`), what to do if that point left the oplog, what to store
    once open, and the stale offsets record to forget before anything (None: none)."""

    start: StartPoint
    if_lost: IfLost
    store: Store = Store.NOTHING
    forget: Committed | None = None
    checkpoint: Token | None = None  # the MongoDB checkpoint's token, when the record was newer
    rescan: bool = False  # open at "now" and publish every document of the outbox first

    @property
    def description(self) -> str:
        """Where the stream opens, for the log line that says so."""
        if self.rescan:
            return "now, after publishing every document the outbox holds (it was added to RELAY_OUTBOXES)"
        if self.store is Store.RESUMED:
            return (
                f"after {short_token(self.start.resume_after)} from the offsets topic's record, newer than the "
                f"MongoDB checkpoint {short_token(self.checkpoint)} (it was not written after the last Kafka commit)"
            )
        return self.start.description


def resume(checkpoint: Checkpoint, committed: Callable[[], Committed | None], rules: Rules) -> Resume:
    """Where a new leading session opens the stream. `committed()` reads the lease's newest
    committed offsets record; it is called at most once, and only where the table says "read".
    Rows are tried in order; "policy" is RELAY_ON_HISTORY_LOST (stop or rescan).

    | MongoDB checkpoint | offsets record | opens | if history lost | then |
    | --- | --- | --- | --- | --- |
    | token; RELAY_DELIVERY=exactly-once here or where it was stored | read: another pipeline's | PipelineMismatchError naming the topic | | |
    | token; RELAY_DELIVERY=exactly-once here or where it was stored | read: newer than the token | after the record's token | policy | store that token |
    | token of another pipeline (fingerprint set and not ours) | not newer, or not read | PipelineMismatchError | | |
    | token | not newer, or not read (at-least-once after at-least-once) | after the token | policy | |
    | no token, RELAY_DELIVERY=exactly-once here | read: a record is forgotten first (a tombstone) | as the rows below | | |
    | no token, the outbox was added to RELAY_OUTBOXES (`rescan`) | | now, after rescanning the outbox | (cannot happen) | nothing (the scan's end is stored once delivered) |
    | no token, a partition's seed (startAtClusterTime) | | at the seed (startAtOperationTime) | policy | store the opening token |
    | no token, RELAY_START_AT=now | | now | (cannot happen) | store the opening token |
    | no token, RELAY_START_AT=<ISO time> | | at that time | policy | store the opening token |
    | no token, RELAY_START_AT=oplog-start | | at the oldest oplog entry | retry (it rolled over) | store the opening token |

    The opening token is stored at once (blog post, Fig. 4b) so that a crash before the first
    batch cannot move the start to a later "now"; but not after a rescan (its documents have no
    position: the opening token is stored once they are delivered, as the scan's end). Raises
    PipelineMismatchError where the table says so: resuming with another pipeline's token could
    skip or repeat events.
    """
    if checkpoint.token is None:
        forget = committed() if rules.delivery == EXACTLY_ONCE else None
        if checkpoint.rescan:
            return Resume(StartPoint(), rules.if_lost, Store.NOTHING, forget, rescan=True)
        start, if_lost = _first_start(checkpoint, rules)
        return Resume(start, if_lost, Store.OPENING, forget)
    if EXACTLY_ONCE in (rules.delivery, checkpoint.delivery):
        record = committed()
        if record is not None and _newer_record(record, checkpoint.token, rules):
            return Resume(StartPoint(resume_after=record.token), rules.if_lost, Store.RESUMED, None, checkpoint.token)
    if checkpoint.fingerprint not in (None, rules.fingerprint):
        raise PipelineMismatchError.between("the stored checkpoint", checkpoint.fingerprint, rules.fingerprint)
    return Resume(StartPoint(resume_after=checkpoint.token), rules.if_lost)


def _newer_record(record: Committed, token: Token, rules: Rules) -> bool:
    """Whether the offsets record lies after the MongoDB checkpoint's token; PipelineMismatchError
    when another pipeline wrote it."""
    if record.fingerprint != rules.fingerprint:
        raise PipelineMismatchError.between(
            f"the newest record in {rules.offsets_topic} (RELAY_OFFSETS_TOPIC) for {record.lease_id}",
            record.fingerprint,
            rules.fingerprint,
        )
    return newer(record.token, token)


def _first_start(checkpoint: Checkpoint, rules: Rules) -> tuple[StartPoint, IfLost]:
    """Where a lease without a token starts (the last four rows of the table)."""
    if checkpoint.seed is not None:
        return StartPoint(at_time=checkpoint.seed), rules.if_lost
    if rules.start_at == "now":
        return StartPoint(), rules.if_lost
    at = start_at_time(rules.start_at)
    if at is not None:
        return StartPoint(at_time=ClusterTime(int(at.timestamp()), 0)), rules.if_lost
    return StartPoint(oplog_start=True), IfLost.RETRY

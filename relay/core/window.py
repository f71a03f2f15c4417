"""The in-flight window: parcels handed to the producer and not yet checkpointed.

Pure bookkeeping, no I/O: a `Parcel` is the messages the loop hands to the producer together (a
read, or a part of one: `split`) and counts their delivery reports; `Window` keeps the parcels in
send order and says which of them may be checkpointed. The loop
(`relay.core.loop`) owns one window per leading session and consults it; the fast loop tests drive
it through in-memory fakes of the producer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from relay.core.positions import Token


class Parcel:
    """Messages handed to the producer together: their changes' commit times, the messages, the
    token that covers them (None for rescanned documents, which have no token of their own), and
    their delivery reports.

    `on_delivery` is the delivery callback of every message of the parcel (bound once per parcel,
    no closure per message). Reports for one Kafka partition arrive in send order; a parcel is
    acknowledged when every report came back without an error.
    """

    __slots__ = (
        "failure",
        "failures",
        "messages",
        "one_by_one",
        "pending",
        "publish_by",
        "read_at",
        "sent_at",
        "size",
        "token",
        "wall_ms",
    )

    def __init__(
        self,
        wall_ms: Sequence[int],
        messages: Sequence[Any],
        token: Token | None,
        sent_at: float,
        one_by_one: bool = False,
        read_at: float | None = None,
        size: int | None = None,
        publish_by: float | None = None,
    ) -> None:
        self.wall_ms = wall_ms  # each change's commit time (Unix ms, -1: unknown), for latency
        self.messages = messages
        self.token = token
        self.pending = len(messages)
        self.failure: tuple[bytes, Any] | None = None  # (value, error) of the first failed report
        self.sent_at = sent_at
        self.read_at = sent_at if read_at is None else read_at  # when its changes were read
        self.one_by_one = one_by_one  # its one message was sent alone (a request of its own)
        # Bytes of its messages' values (the loop knows them from `split`; counted here if not).
        self.size = sum(len(m.value) for m in messages) if size is None else size
        # Where the first failed report is announced (the publisher's list; it drops its queue).
        self.failures: list[Parcel] | None = None
        # Monotonic time after which none of its messages may reach the broker any more: its
        # lease is no longer provably held then (relay.core.checkpoints). A publisher that writes
        # to the wire itself checks it first (relay.nats); None: no such bound.
        self.publish_by = publish_by

    def hold(self) -> None:
        """One more report to wait for: the commit of the transaction holding this parcel
        (exactly-once mode). Until `release()`, the parcel is neither done nor acknowledged."""
        self.pending += 1

    def release(self, failure: tuple[bytes, Any] | None = None) -> None:
        """The transaction holding this parcel ended: committed (no `failure`), or aborted, with
        the error standing for it when no report failed already (nothing of it is visible)."""
        self.pending -= 1
        if failure is not None and self.failure is None:
            self.failure = failure

    def on_delivery(self, err: Any, msg: Any) -> None:
        self.pending -= 1
        if err is not None:
            self._fail((msg.value() or b"", err))  # failed reports carry no headers

    def reported(self, count: int, failure: tuple[bytes, Any] | None = None) -> None:
        """`count` reports came back at once (a publisher that counts a parcel's acknowledgements
        itself); `failure` is the first failed one's (value, error), if any."""
        self.pending -= count
        if failure is not None:
            self._fail(failure)

    def refuse(self, count: int, failure: tuple[bytes, Any]) -> None:
        """The last `count` messages were never handed over (the producer had stopped): no
        report comes for them; they failed with `failure`."""
        self.pending -= count
        self._fail(failure)

    def _fail(self, failure: tuple[bytes, Any]) -> None:
        """Keep the first failure and announce it where the publisher looks (`failures`)."""
        if self.failure is None:
            self.failure = failure
            if self.failures is not None:
                self.failures.append(self)

    @property
    def done(self) -> bool:
        """Every report is in (successful or not)."""
        return self.pending <= 0

    @property
    def acknowledged(self) -> bool:
        """Every report is in and none failed."""
        return self.pending <= 0 and self.failure is None

    def failed_event_id(self) -> str:
        """The event id of the first failed report (matched by value), or "?"."""
        if self.failure is None:
            return "?"
        value = self.failure[0]
        return next((m.event_id for m in self.messages if m.value == value), "?")


class Window:
    """Parcels in send order, not yet checkpointed.

    Invariants (enforced by the loop through `room` and `pop_acknowledged`):
    - at most `max_events` messages are unacknowledged at once (RELAY_BATCH_MAX_EVENTS): this
      bounds memory and what a replica that lost its lease can still publish late;
    - a token is handed out for storing only when its parcel and every parcel before it
      were acknowledged, so a stored token never covers an event whose report did not succeed.

    `Window.transaction(...)` is the window of exactly-once mode: one Kafka transaction spans
    several reads, and a parcel is acknowledged only once the transaction holding it committed
    (relay.kafka.transactions holds its report back until then). So the window holds the open
    transaction's reads, up to `max_events` (RELAY_TRANSACTION_MAX_EVENTS); the loop does not wait
    for them after a step (`keep`), and reads shrink to fit the room left (`full` only when none is).
    """

    def __init__(self, max_events: int, depth: int, read_size: int | None = None, fills: bool = False) -> None:
        self.max_events = max_events
        self.depth = depth
        # Reads in flight at once share the limit, so each read takes a slice of it.
        self.slice = read_size or max(1, -(-max_events // depth))
        self.fills = fills
        # Parcels left in flight after a step (more would make the loop wait for the oldest).
        self.keep = max_events if fills else depth - 1
        self._parcels: deque[Parcel] = deque()
        self.unacknowledged = 0

    @classmethod
    def transaction(cls, max_events: int, read_size: int) -> Window:
        """Exactly-once mode's window: reads of at most `read_size` events (RELAY_BATCH_MAX_EVENTS)
        held until their transaction commits, at most `max_events` in all."""
        return cls(max_events, 1, read_size=read_size, fills=True)

    @property
    def full(self) -> bool:
        """No room for a whole read (a transaction's window: no room at all, reads shrink to fit)."""
        return self.room < (1 if self.fills else self.slice)

    def __len__(self) -> int:
        return len(self._parcels)

    @property
    def room(self) -> int:
        """How many more messages may be handed to the producer now."""
        return self.max_events - self.unacknowledged

    @property
    def oldest(self) -> Parcel | None:
        return self._parcels[0] if self._parcels else None

    def add(self, parcel: Parcel) -> None:
        if len(parcel.messages) > self.room:
            raise ValueError(f"{len(parcel.messages)} messages do not fit the window's room of {self.room}")
        self._parcels.append(parcel)
        self.unacknowledged += len(parcel.messages)

    def pop_acknowledged(self) -> Parcel:
        """Remove and return the oldest parcel, which must be acknowledged."""
        parcel = self._parcels[0]
        if not parcel.acknowledged:
            raise ValueError("the oldest parcel is not acknowledged")
        self._parcels.popleft()
        self.unacknowledged -= len(parcel.messages)
        return parcel

    def clear(self) -> None:
        """Forget everything in flight (the producer was dropped; the loop replays from the checkpoint)."""
        self._parcels.clear()
        self.unacknowledged = 0


def split(sizes: Sequence[int], max_bytes: int, alone: int = 0) -> list[tuple[int, bool]]:
    """How to hand messages of these value sizes to the producer: the end index of each parcel,
    and whether it is a message sent alone.

    The first `alone` messages go one per parcel (after a refused record batch, so the broker's
    answer names one event); the rest in parcels that stop once they hold `max_bytes`
    (RELAY_BATCH_MAX_BYTES), each with at least one message.
    """
    ends: list[tuple[int, bool]] = []
    alone = min(alone, len(sizes))
    ends += [(i + 1, True) for i in range(alone)]
    held = 0
    for i in range(alone, len(sizes)):
        held += sizes[i]
        if held >= max_bytes:
            ends.append((i + 1, False))
            held = 0
    if (ends[-1][0] if ends else 0) < len(sizes):
        ends.append((len(sizes), False))
    return ends

"""Exactly-once mode's bookkeeping on the loop's thread: the open transaction, and the parcels
waiting for the commit in flight (relay.kafka.transactions).

Both are pure (no producer call) and the loop's thread alone reads and writes them; the commit
thread (relay.kafka.committer) never sees them. `OpenTransaction` is the transaction the producer
has begun (or begins at the next parcel): the loop fills it, then leaves it as it is while its
commit runs, then starts a new one once that commit ended. `WaitingParcels` holds what the loop
hands over meanwhile: held (relay.core.window.Parcel.hold) and not produced yet, since the
producer allows one transaction at a time.
"""

from __future__ import annotations

from collections import deque

from relay.core.positions import Token
from relay.core.window import Parcel


class OpenTransaction:
    """One transaction: its parcels (each held until it ends), their events and bytes, when it was
    begun and whether the producer has begun it (`begin_transaction` called, not yet committed
    nor aborted: an abort is due if it fails)."""

    def __init__(self) -> None:
        self.parcels: list[Parcel] = []
        self.events = 0
        self.bytes = 0
        self.opened_at = 0.0  # the hand-over of its first parcel: its time bound counts their wait
        self.begun = False

    def begin(self, at: float) -> None:
        """The producer began it (`begin_transaction`); its time bound counts from `at`."""
        self.begun = True
        self.opened_at = at

    def add(self, parcel: Parcel) -> None:
        """`parcel` joins it (its messages are produced into it next)."""
        self.parcels.append(parcel)
        self.events += len(parcel.messages)
        self.bytes += parcel.size

    def full(self, max_events: int, max_bytes: int) -> bool:
        """Whether it reached RELAY_TRANSACTION_MAX_EVENTS or _BYTES."""
        return self.events >= max_events or self.bytes >= max_bytes

    def due_in(self, max_s: float, now: float) -> float | None:
        """Seconds until it was begun `max_s` ago (RELAY_TRANSACTION_MAX_MS); None while it holds no parcel."""
        return self.opened_at + max_s - now if self.parcels else None

    def newest_token(self) -> Token | None:
        """The token of its newest parcel that has one (what its offsets record carries)."""
        return next((d.token for d in reversed(self.parcels) if d.token is not None), None)

    def topics(self) -> list[str]:
        """The topics its parcels' messages go to, sorted."""
        return sorted({m.topic for d in self.parcels for m in d.messages})


class WaitingParcels:
    """Parcels handed over while a commit is in flight, in hand-over order, and when the first of
    them was handed over (the next transaction's time bound counts from then). A parcel handed
    over when no commit is in flight passes through at once."""

    def __init__(self) -> None:
        self._parcels: deque[Parcel] = deque()
        self.since = 0.0

    def __len__(self) -> int:
        return len(self._parcels)

    def add(self, parcel: Parcel, now: float) -> None:
        if not self._parcels:
            self.since = now
        self._parcels.append(parcel)

    def pop(self) -> Parcel:
        """The oldest; the others keep waiting since the same time (they waited that long too)."""
        return self._parcels.popleft()

    def due_in(self, max_s: float, now: float) -> float:
        """Seconds they may still wait (RELAY_TRANSACTION_MAX_MS from the first one's hand-over);
        the whole bound while none waits (the next one is handed over no earlier than now)."""
        return self.since + max_s - now if self._parcels else max_s

    def take_all(self) -> list[Parcel]:
        """Every waiting parcel, oldest first; none waits any more."""
        parcels = list(self._parcels)
        self._parcels.clear()
        return parcels

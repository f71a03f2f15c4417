"""The checkpoints of every scope one process leads, stored together, at most once per
RELAY_CHECKPOINT_INTERVAL_MS or every RELAY_CHECKPOINT_MAX_EVENTS acknowledged events, whichever
comes first (docs/architecture.md, "Checkpoints").

Each leading loop hands its newest acknowledged token to the process's one `Coalescer` (`hold`),
with how many events were acknowledged since its last hand-over, which keeps one checkpoint per
lease and writes all it holds in ONE fenced write through its CheckpointStore
(relay.mongo.checkpoints: one MongoDB transaction) once the interval has passed since the last
write, or once the events held by every loop together reach the count. Every loop asks at each
step (`write`), so a held checkpoint waits at most about one interval plus one read, and during a
catch-up at most about the count; with an interval of 0 each hold is written at once, after every
batch.

Rules, each enforced here (tests/unit/test_coalescer.py):
- Only what a loop hands over is written, and a loop hands over a token only once the broker
  acknowledged every event it covers (relay.core.loop `_settle`): a stored checkpoint never covers
  an unacknowledged event. What is held and not yet written is lost on a crash: the duplicate
  window grows by at most the interval or the count (plus one read), nothing is lost.
- Each checkpoint is written under its own grant (owner and fencing token): a lease found lost
  refuses its own checkpoint only; the others are stored by the same write, and the lost lease's
  loop learns it (LeaseLostError) at its next call, whichever loop made the write.
- Checkpoints only move forward: a held checkpoint is replaced only by a newer one of the same
  grant; a session starts (`begin`) with nothing held for its lease and ends (`end`) by writing
  what it holds or dropping it, after any write in flight, so nothing of an earlier session is
  written once a later session has read its grant.
- A write that fails keeps its checkpoints held for the next one (a newer hold meanwhile wins),
  and their events count towards the next; its error reaches the loop that made it. The interval
  still counts from that attempt.
- A write renews every lease it stores (relay.mongo.checkpoints): `renewed_at` gives, per lease,
  when the last write that stored it began (its lease is valid for a TTL from then, by the server's
  clock: relay.core.checkpoints).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from relay.core.boundaries import CheckpointStore, Clock, LeaseStore
from relay.core.errors import LeaseLostError
from relay.core.positions import CheckpointWrite, Token, newer


class Coalescer:
    """The process's checkpoints on their way to `store`, written together every `interval_s`."""

    def __init__(self, store: CheckpointStore, interval_s: float, clock: Clock, max_events: int | None = None) -> None:
        self._store = store
        self.interval_s = interval_s
        self.max_events = max_events  # None: the interval alone decides
        self._clock = clock
        self._lock = threading.Lock()  # guards the fields below, never held across a write
        self._writing = threading.Lock()  # one write at a time; `begin` and `end` wait for it
        self._held: dict[str, CheckpointWrite] = {}
        self._stored: dict[str, Token] = {}  # written, not yet reported to its loop
        self._lost: dict[str, LeaseLostError] = {}  # refused, not yet reported to its loop
        self._last_write: float | None = None  # monotonic time the last write began
        self._events = 0  # events acknowledged in the checkpoints held, since the last write began
        self._renewed: dict[str, float] = {}  # monotonic time the last write storing a lease began

    def begin(self, lease_id: str) -> None:
        """A session of `lease_id` starts (its grant was just read): nothing of an earlier one is held."""
        with self._writing, self._lock:
            self._forget(lease_id)

    def hold(self, checkpoint: CheckpointWrite, events: int = 0) -> None:
        """Keep `checkpoint` as its lease's next one (every event its token covers acknowledged by
        the broker), unless one held is newer; `events` were acknowledged since the lease's last
        hold (they count towards RELAY_CHECKPOINT_MAX_EVENTS). Raises LeaseLostError if a write
        refused that lease."""
        with self._lock:
            self._raise_lost(checkpoint.lease_id)
            self._events += events
            held = self._held.get(checkpoint.lease_id)
            if held is None or held.grant != checkpoint.grant or newer(checkpoint.token, held.token):
                self._held[checkpoint.lease_id] = checkpoint

    def holds(self, lease_id: str) -> bool:
        """Whether a checkpoint of `lease_id` waits to be written."""
        with self._lock:
            return lease_id in self._held

    def write(self, lease_id: str, *, due: bool = True) -> Token | None:
        """Write every held checkpoint now (`due=False`), or only once the interval has passed since
        the last write. Returns the newest token of `lease_id` stored since its loop last asked
        (by this write or another loop's), else None; raises LeaseLostError if a write refused it,
        and whatever this write raised."""
        self._write(due)
        with self._lock:
            self._raise_lost(lease_id)
            return self._stored.pop(lease_id, None)

    def renewed_at(self, lease_id: str) -> float | None:
        """The monotonic time the last write that stored `lease_id`'s checkpoint began (None: none
        yet): that write renewed its lease."""
        with self._lock:
            return self._renewed.get(lease_id)

    def end(self, lease_id: str, *, store: bool) -> Token | None:
        """The session of `lease_id` ends: write what it holds (`store`; a failure only logs in the
        caller, who replays from the stored checkpoint) or drop it; either way nothing of it stays.
        Returns its token stored since last asked, as `write` does."""
        stored = None
        try:
            if store:
                stored = self.write(lease_id, due=False)
        finally:
            with self._writing, self._lock:
                self._forget(lease_id)
        return stored

    # ---- internals ----------------------------------------------------------------------------

    def _due(self) -> bool:
        last = self._last_write
        if self.max_events is not None and self._events >= self.max_events:
            return True
        return last is None or self._clock.monotonic() - last >= self.interval_s

    def _write(self, due: bool) -> None:
        with self._lock:
            if not self._held or (due and not self._due()):
                return
        with self._writing:
            with self._lock:
                if not self._held or (due and not self._due()):
                    return  # another loop's write took them meanwhile
                batch, self._held = self._held, {}
                events, self._events = self._events, 0
                began = self._last_write = self._clock.monotonic()
            try:
                refused = self._store.store(list(batch.values()))
            except BaseException:
                with self._lock:
                    for lid, checkpoint in batch.items():
                        self._held.setdefault(lid, checkpoint)
                    self._events += events
                raise
            with self._lock:
                for lid, checkpoint in batch.items():
                    if lid in refused:
                        self._lost[lid] = _lost(checkpoint)
                        self._held.pop(lid, None)  # held under the same grant: refused as well
                        self._stored.pop(lid, None)
                    else:
                        self._stored[lid] = checkpoint.token
                        self._renewed[lid] = began

    def _raise_lost(self, lease_id: str) -> None:
        lost = self._lost.pop(lease_id, None)
        if lost is not None:
            self._held.pop(lease_id, None)
            raise lost

    def _forget(self, lease_id: str) -> None:
        self._held.pop(lease_id, None)
        self._renewed.pop(lease_id, None)
        self._stored.pop(lease_id, None)
        self._lost.pop(lease_id, None)


def _lost(checkpoint: CheckpointWrite) -> LeaseLostError:
    g = checkpoint.grant
    return LeaseLostError(
        f"lease on {checkpoint.lease_id} lost: fencing token {g.fencing_token} of {g.owner} is no longer current"
    )


class LeaseByLease:
    """A CheckpointStore writing each checkpoint to its own lease document, one update each (a loop
    run on its own, as the fast loop tests do; the relay process uses relay.mongo.checkpoints)."""

    def __init__(self, lease: LeaseStore) -> None:
        self._lease = lease

    def store(self, checkpoints: Sequence[CheckpointWrite]) -> set[str]:
        refused = set()
        for p in checkpoints:
            try:
                self._lease.store_checkpoint(p.grant, p.token, p.fingerprint)
            except LeaseLostError:
                refused.add(p.lease_id)
        return refused

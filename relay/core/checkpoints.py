"""The checkpoint writer: every write a leading session makes to its lease document.

Rules (each enforced here, tested in tests/unit/test_checkpoints.py):
- `store(token)` hands the checkpoint to the process's positions (relay.core.coalescer), written
  fenced with the other scopes' at most once per RELAY_CHECKPOINT_INTERVAL_MS (`now`: at once, for
  the position a stream opens at); the caller calls it only once every event the token covers was
  acknowledged by Kafka (guarantee 1: relay.core.loop's `_settle`). Each step (`beat`, `idle`)
  gives the due write its turn and learns what was written for this lease, by whichever loop.
- While leading, the lease document is written at least every RELAY_HEARTBEAT_INTERVAL_S: `beat()`
  renews it when that much time passed since the last write (a stored position or a renewal), so a
  slow broker is not a takeover, and a replica that was paused learns at its next write that it
  lost the lease (LeaseLostError).
- An idle read's newer token (guarantee 7: the post-batch token of an idle outbox) is handed over
  at most every heartbeat interval (`idle`); one not handed over yet is when the session ends
  (`flush`, which writes everything held at once: a graceful stop stores its final position before
  the lease is released). A newer read with events makes it moot (`read`). Newer means after the
  last token handed over, which a session starts from its grant's checkpoint: an idle store never
  moves the checkpoint back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from relay.core.boundaries import Clock, LeaseStore
from relay.core.coalescer import Coalescer, LeaseByLease
from relay.core.positions import Grant, PositionWrite, Token, newer, short_token

log = logging.getLogger("relay")


class CheckpointWriter:
    """The writes of one relay loop to its lease document, for the session of `grant` (`begin`);
    its positions go through `positions`, the process's (alone: written at once, lease by lease)."""

    def __init__(
        self,
        lease: LeaseStore,
        fingerprint: str,
        clock: Clock,
        heartbeat_interval_s: float,
        stored: Callable[[Token], None],
        positions: Coalescer | None = None,
    ) -> None:
        self._lease = lease
        self._positions = positions or Coalescer(LeaseByLease(lease), 0.0, clock)
        self._fingerprint = fingerprint
        self._clock = clock
        self._interval = heartbeat_interval_s
        self._stored = stored  # told of every token stored (the observer)
        self._grant: Grant | None = None
        self._last_write = 0.0  # monotonic time of the last write to the lease document
        self._last_token: Token | None = None  # the last token handed over (stored, or held to be)
        self._unstored: Token | None = None  # an idle read's newer token, not handed over yet

    def begin(self, grant: Grant) -> None:
        """A session of `grant` starts: taking the lease was a write; its checkpoint is the last token stored."""
        self._positions.begin(self._lease.lease_id)
        self._grant, self._unstored, self._last_token = grant, None, grant.checkpoint.token
        self._last_write = self._clock.monotonic()

    @property
    def grant(self) -> Grant:
        assert self._grant is not None, "begin() first"
        return self._grant

    def store(self, token: Token, *, now: bool = False) -> None:
        """Hand `token` over as the checkpoint (fenced, majority), written with the process's other
        positions once the interval is due (`now`: at once); called only once every event it
        covers was acknowledged."""
        self._positions.hold(PositionWrite(self._lease.lease_id, self.grant, token, self._fingerprint))
        self._last_token, self._unstored = token, None
        self._written(self._positions.write(self._lease.lease_id, due=not now))

    def _written(self, token: Token | None) -> None:
        """`token` was stored for this lease (by this loop's write or another's): the lease was renewed."""
        if token is not None:
            self._last_write = self._clock.monotonic()
            self._stored(token)
            log.debug("checkpoint %s fencing=%d", short_token(token), self.grant.fencing_token)

    def renew(self) -> None:
        """Renew the lease (fenced)."""
        self._lease.renew(self.grant)
        self._last_write = self._clock.monotonic()

    def beat(self) -> None:
        """Give the process's due write its turn, then renew the lease if a heartbeat interval
        passed since the last write."""
        self._written(self._positions.write(self._lease.lease_id))
        if self._clock.monotonic() - self._last_write >= self._interval:
            self.renew()

    def read(self) -> None:
        """A read returned events: its own token will cover more than an unstored idle token."""
        self._unstored = None

    def idle(self, token: Token | None) -> None:
        """Nothing new was read and everything in flight is stored: store the read's post-batch
        `token` (or renew) once a heartbeat interval has passed since the last write, else keep a
        newer token for later."""
        self._written(self._positions.write(self._lease.lease_id))
        last = self._last_token
        fresh = token if token is not None and (last is None or newer(token, last)) else None
        if self._clock.monotonic() - self._last_write >= self._interval:
            if fresh is not None:
                self.store(fresh)  # idle: the post-batch token still advances
            else:
                self.renew()
        elif fresh is not None:
            self._unstored = fresh  # e.g. the end of a rescan: stored at the latest when the session ends

    def flush(self) -> None:
        """The session ends with everything delivered: write at once what is held, with the idle
        token not handed over yet."""
        if self._unstored is not None:
            self.store(self._unstored, now=True)
        else:
            self._written(self._positions.write(self._lease.lease_id, due=False))

    def end(self, *, store: bool) -> None:
        """The session is over: write what it holds (`store`; raises what the write raised) or drop
        it (its lease is lost); either way nothing of it is written later."""
        self._unstored = None
        self._written(self._positions.end(self._lease.lease_id, store=store))

"""The checkpoint writer: every write a leading session makes to its lease document.

Rules (each enforced here, tested in tests/unit/test_checkpoints.py):
- `store(token)` writes the checkpoint, fenced; the caller calls it only once every event the token
  covers was acknowledged by Kafka (guarantee 1: relay.core.loop's `_settle`).
- While leading, the lease document is written at least every RELAY_HEARTBEAT_INTERVAL_S: `beat()`
  renews it when that much time passed since the last write (a store or a renewal), so a slow
  broker is not a takeover, and a replica that was paused learns at its next write that it lost
  the lease (LeaseLostError).
- An idle read's newer token (guarantee 7: the post-batch token of an idle outbox) is stored at
  most every heartbeat interval (`idle`); one not stored yet is stored when the session ends
  (`flush`). A newer read with events makes it moot (`read`). Newer means after the last token
  stored, which a session starts from its grant's checkpoint: an idle store never moves the
  checkpoint back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from relay.core.boundaries import Clock, LeaseStore
from relay.core.positions import Grant, Token, newer, short_token

log = logging.getLogger("relay")


class CheckpointWriter:
    """The writes of one relay loop to its lease document, for the session of `grant` (`begin`)."""

    def __init__(
        self,
        lease: LeaseStore,
        fingerprint: str,
        clock: Clock,
        heartbeat_interval_s: float,
        stored: Callable[[Token], None],
    ) -> None:
        self._lease = lease
        self._fingerprint = fingerprint
        self._clock = clock
        self._interval = heartbeat_interval_s
        self._stored = stored  # told of every token stored (the observer)
        self._grant: Grant | None = None
        self._last_write = 0.0  # monotonic time of the last write to the lease document
        self._last_token: Token | None = None  # the last token stored
        self._unstored: Token | None = None  # an idle read's newer token, not stored yet

    def begin(self, grant: Grant) -> None:
        """A session of `grant` starts: taking the lease was a write; its checkpoint is the last token stored."""
        self._grant, self._unstored, self._last_token = grant, None, grant.checkpoint.token
        self._last_write = self._clock.monotonic()

    @property
    def grant(self) -> Grant:
        assert self._grant is not None, "begin() first"
        return self._grant

    def store(self, token: Token) -> None:
        """Store `token` as the checkpoint (fenced, majority); called only once every event it
        covers was acknowledged."""
        self._lease.store_checkpoint(self.grant, token, self._fingerprint)
        self._last_write = self._clock.monotonic()
        self._last_token, self._unstored = token, None
        self._stored(token)
        log.debug("checkpoint %s fencing=%d", short_token(token), self.grant.fencing_token)

    def renew(self) -> None:
        """Renew the lease (fenced)."""
        self._lease.renew(self.grant)
        self._last_write = self._clock.monotonic()

    def beat(self) -> None:
        """Renew the lease if a heartbeat interval passed since the last write."""
        if self._clock.monotonic() - self._last_write >= self._interval:
            self.renew()

    def read(self) -> None:
        """A read returned events: its own token will cover more than an unstored idle token."""
        self._unstored = None

    def idle(self, token: Token | None) -> None:
        """Nothing new was read and everything in flight is stored: store the read's post-batch
        `token` (or renew) once a heartbeat interval has passed since the last write, else keep a
        newer token for later."""
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
        """The session ends with everything delivered: store the idle token not stored yet."""
        if self._unstored is not None:
            self.store(self._unstored)

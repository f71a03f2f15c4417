"""The checkpoint writer: every write a leading session makes to its lease document.

Rules (each enforced here, tested in tests/unit/test_checkpoints.py):
- `store(token)` hands the checkpoint to the process's coalescer (relay.core.coalescer), written
  fenced with the other scopes' at most once per RELAY_CHECKPOINT_INTERVAL_MS (`now`: at once, for
  the token a stream opens at); the caller calls it only once every event the token covers was
  acknowledged by the broker (guarantee 1: relay.core.loop's `_settle`). Each step (`beat`, `idle`)
  gives the due write its turn and learns what was written for this lease, by whichever loop.
- While leading, the lease document is written at least every RELAY_HEARTBEAT_INTERVAL_S: `beat()`
  renews it when that much time passed since the last write (a stored checkpoint or a renewal), so a
  slow broker is not a takeover, and a replica that was paused learns at its next write that it
  lost the lease (LeaseLostError).
- An idle read's newer token (guarantee 7: the post-batch token of an idle outbox) is handed over
  at most every heartbeat interval (`idle`); one not handed over yet is when the session ends
  (`flush`, which writes everything held at once: a graceful stop stores its final checkpoint before
  the lease is released). A newer read with events makes it moot (`read`). Newer means after the
  last token handed over, which a session starts from its grant's checkpoint: an idle store never
  moves the checkpoint back.
- A lease is valid, provably, until `valid_until`: RELAY_LEASE_TTL_S after the last write that
  extended it began (taking it, a renewal, a stored checkpoint; the server sets its expiry from its
  own clock after the write arrives, so never earlier), less a margin of one heartbeat interval. A
  renewal or a due checkpoint write that fails with an error a restart would cure (`transient`)
  while the lease is valid does not end the session: it says so in one WARNING line, keeps the
  checkpoints held and tries again (at most every heartbeat interval / 5). Once the lease is no
  longer provably valid and no write succeeded, the next `beat` raises LeaseUnrenewedError: the
  session stops publishing before the lease can expire and another replica take it. The token
  a stream opens at (`store(now=True)`), a lost lease and any other error are raised at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from relay.core.boundaries import Clock, LeaseStore
from relay.core.coalescer import Coalescer, LeaseByLease
from relay.core.config import LeaseTiming
from relay.core.errors import LeaseUnrenewedError
from relay.core.positions import CheckpointWrite, Grant, Token, newer, short_token

log = logging.getLogger("relay")


class CheckpointWriter:
    """The writes of one relay loop to its lease document, for the session of `grant` (`begin`);
    its checkpoints go through `coalescer`, the process's (alone: written at once, lease by lease)."""

    def __init__(
        self,
        lease: LeaseStore,
        fingerprint: str,
        clock: Clock,
        timing: LeaseTiming,
        stored: Callable[[Token], None],
        coalescer: Coalescer | None = None,
        transient: Callable[[BaseException], bool] = lambda exc: False,
    ) -> None:
        self._lease = lease
        self._coalescer = coalescer or Coalescer(LeaseByLease(lease), 0.0, clock)
        self._fingerprint = fingerprint
        self._clock = clock
        self._interval = timing.heartbeat_interval_s
        self._ttl = timing.lease_ttl_s
        self._stored = stored  # told of every token stored (the observer)
        self._transient = transient  # whether a failed write is one a later attempt may cure
        self._grant: Grant | None = None
        self._last_write = 0.0  # monotonic time of the last write to the lease document
        self._last_token: Token | None = None  # the last token handed over (stored, or held to be)
        self._unstored: Token | None = None  # an idle read's newer token, not handed over yet
        self._valid_until = 0.0  # monotonic time until which the lease is provably ours
        self._failing: BaseException | None = None  # the last failed write, while none succeeded since
        self._retry_at = 0.0  # no renewal before this after a failure (monotonic)

    def begin(self, grant: Grant, asked_at: float | None = None) -> None:
        """A session of `grant` starts: taking the lease (asked for at monotonic `asked_at`,
        default now) was a write; its checkpoint is the last token stored."""
        self._coalescer.begin(self._lease.lease_id)
        self._grant, self._unstored, self._last_token = grant, None, grant.checkpoint.token
        now = self._clock.monotonic()
        self._last_write, self._failing, self._retry_at = now, None, 0.0
        self._extended(now if asked_at is None else asked_at)

    @property
    def valid_until(self) -> float:
        """The monotonic time until which the lease is provably held (its expiry by the server's
        clock, less one heartbeat interval): nothing may be published after it unless a write
        extends it."""
        return self._valid_until

    def _extended(self, began: float) -> None:
        """A write that extended the lease began at monotonic `began`."""
        self._valid_until = max(self._valid_until, began + self._ttl - self._interval)

    @property
    def grant(self) -> Grant:
        assert self._grant is not None, "begin() first"
        return self._grant

    def store(self, token: Token, *, now: bool = False, events: int = 0) -> None:
        """Hand `token` over as the checkpoint (fenced, majority), written with the process's other
        checkpoints once the interval or the event count is due (`now`: at once, and a failure is
        raised); called only once every event it covers was acknowledged, `events` of them since
        the last hand-over."""
        lid = self._lease.lease_id
        self._coalescer.hold(CheckpointWrite(lid, self.grant, token, self._fingerprint), events)
        self._last_token, self._unstored = token, None
        if now:
            self._written(self._coalescer.write(lid, due=False))
        else:
            self._due_write()

    def _due_write(self) -> None:
        """Give the process's due write its turn (a failure survives while the lease is valid)."""
        try:
            token = self._coalescer.write(self._lease.lease_id)
        except Exception as exc:  # noqa: BLE001 - _failed re-raises all but a transient failure
            self._failed(exc)
            return
        self._written(token)

    def _written(self, token: Token | None) -> None:
        """`token` was stored for this lease (by this loop's write or another's): the lease was renewed."""
        if token is not None:
            self._last_write = self._clock.monotonic()
            self._failing = None
            began = self._coalescer.renewed_at(self._lease.lease_id)
            self._extended(self._last_write if began is None else began)
            self._stored(token)
            log.debug("checkpoint %s fencing=%d", short_token(token), self.grant.fencing_token)

    def renew(self) -> None:
        """Renew the lease (fenced); raises what the write raised."""
        began = self._clock.monotonic()
        self._lease.renew(self.grant)
        self._last_write, self._failing = self._clock.monotonic(), None
        self._extended(began)

    def _renew_surviving(self) -> None:
        """Renew the lease; a failure survives while the lease is provably valid."""
        if self._clock.monotonic() < self._retry_at:
            return
        try:
            self.renew()
        except Exception as exc:  # noqa: BLE001 - _failed re-raises all but a transient failure
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """A lease write failed: raise unless a later attempt may cure it and the lease is
        provably valid meanwhile (then one WARNING line, and a retry after a short wait)."""
        now = self._clock.monotonic()
        if not self._transient(exc):
            raise exc
        if now >= self._valid_until:
            raise self._unrenewed(exc) from exc
        if self._failing is None:
            log.warning(
                "could not write the lease on %s (%s); it is valid for %.1f s more: publishing on, retrying",
                self._lease.lease_id,
                exc,
                self._valid_until - now,
            )
        self._failing = exc
        self._retry_at = now + self._interval / 5

    def _check_valid(self) -> None:
        """Raise LeaseUnrenewedError once the lease is no longer provably held after failed writes."""
        failing = self._failing
        if failing is not None and self._clock.monotonic() >= self._valid_until:
            raise self._unrenewed(failing) from failing

    def _unrenewed(self, exc: BaseException) -> LeaseUnrenewedError:
        left = self._valid_until + self._interval - self._clock.monotonic()
        when = f"{left:.0f} s before it can expire" if left > 0 else "as it may have expired"
        return LeaseUnrenewedError(
            f"the lease on {self._lease.lease_id} could not be renewed ({exc}): stopped publishing {when}; "
            "restarting from the stored checkpoint"
        )

    def beat(self) -> None:
        """Give the process's due write its turn, then renew the lease if a heartbeat interval
        passed since the last write; raise LeaseUnrenewedError when failed writes let the lease
        come within a heartbeat interval of its expiry (the session must stop publishing)."""
        self._due_write()
        if self._clock.monotonic() - self._last_write >= self._interval:
            self._renew_surviving()
        self._check_valid()

    def read(self) -> None:
        """A read returned events: its own token will cover more than an unstored idle token."""
        self._unstored = None

    def idle(self, token: Token | None) -> None:
        """Nothing new was read and everything in flight is stored: store the read's post-batch
        `token` (or renew) once a heartbeat interval has passed since the last write, else keep a
        newer token for later."""
        self._due_write()
        last = self._last_token
        fresh = token if token is not None and (last is None or newer(token, last)) else None
        if self._clock.monotonic() - self._last_write >= self._interval:
            if fresh is not None:
                self.store(fresh)  # idle: the post-batch token still advances
            else:
                self._renew_surviving()
            self._check_valid()
        elif fresh is not None:
            self._unstored = fresh  # e.g. the end of a rescan: stored at the latest when the session ends

    def flush(self) -> None:
        """The session ends with everything delivered: write at once what is held, with the idle
        token not handed over yet."""
        if self._unstored is not None:
            self.store(self._unstored, now=True)
        else:
            self._written(self._coalescer.write(self._lease.lease_id, due=False))

    def end(self, *, store: bool) -> None:
        """The session is over: write what it holds (`store`; raises what the write raised) or drop
        it (its lease is lost); either way nothing of it is written later."""
        self._unstored = None
        self._written(self._coalescer.end(self._lease.lease_id, store=store))

"""The checkpoint writer's rules (relay.core.checkpoints), fast: a fake clock and a lease store that
records its writes."""

from __future__ import annotations

from typing import Any

import pytest

from relay.core.checkpoints import CheckpointWriter
from relay.core.coalescer import Coalescer, LeaseByLease
from relay.core.config import LeaseTiming
from relay.core.errors import LeaseLostError, LeaseUnrenewedError, ServerError
from relay.core.positions import Checkpoint, Grant
from tests.unit.fakes import Clock

GRANT = Grant("me", 3, None, Checkpoint(None, None, None, None, None))


class Lease:
    """A lease store that records each write: ("store", token) or ("renew",)."""

    lease_id = "db.outbox"

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.writes: list[tuple[Any, ...]] = []
        self.lost = False
        self.failing: Exception | None = None  # every write raises it

    def store_checkpoint(self, grant: Grant, token: Any, fingerprint: str) -> None:
        self._fenced(grant)
        self.writes.append(("store", token["_data"], fingerprint))

    def renew(self, grant: Grant) -> None:
        self._fenced(grant)
        self.writes.append(("renew",))

    def _fenced(self, grant: Grant) -> None:
        assert grant is self.grant
        if self.lost:
            raise LeaseLostError("lost")
        if self.failing is not None:
            raise self.failing


TTL = 20.0


def _timing(interval: float) -> LeaseTiming:
    return LeaseTiming(lease_ttl_s=max(TTL, 2 * interval), heartbeat_interval_s=interval, standby_poll_s=1.0)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, ServerError)


def _writer(interval: float = 5.0, grant: Grant = GRANT) -> tuple[CheckpointWriter, Lease, Clock, list[Any]]:
    lease, clock, stored = Lease(grant), Clock(), []
    writer = CheckpointWriter(lease, "fp", clock, _timing(interval), stored.append, transient=_transient)  # type: ignore[arg-type]
    writer.begin(grant)
    return writer, lease, clock, stored


def test_a_stored_token_is_written_fenced_with_the_fingerprint_and_reported():
    writer, lease, _, stored = _writer()
    writer.store({"_data": "01"})
    assert lease.writes == [("store", "01", "fp")] and stored == [{"_data": "01"}]


def test_beat_renews_only_once_a_heartbeat_interval_passed_since_the_last_write():
    writer, lease, clock, _ = _writer(interval=5.0)
    clock.advance(4.9)
    writer.beat()
    assert lease.writes == [], "taking the lease was a write 4.9 s ago"
    clock.advance(0.2)
    writer.beat()
    assert lease.writes == [("renew",)]
    clock.advance(3.0)
    writer.store({"_data": "02"})
    clock.advance(3.0)
    writer.beat()
    assert lease.writes[-1][0] == "store", "a store is a write too: no renewal 3 s after it"


def test_a_replica_that_lost_its_lease_learns_it_at_its_next_write():
    writer, lease, clock, _ = _writer()
    lease.lost = True
    clock.advance(6)
    with pytest.raises(LeaseLostError):
        writer.beat()


def test_an_idle_token_is_stored_at_most_every_interval_and_at_the_latest_when_the_session_ends():
    writer, lease, clock, _ = _writer(interval=5.0)
    writer.idle({"_data": "10"})
    assert lease.writes == [], "within the interval: kept for later"
    clock.advance(5)
    writer.idle({"_data": "11"})
    assert lease.writes == [("store", "11", "fp")]
    writer.idle({"_data": "12"})
    writer.flush()
    assert lease.writes[-1] == ("store", "12", "fp"), "the session's end stores the newer idle token"


def test_an_idle_pass_with_nothing_newer_renews_instead():
    writer, lease, clock, _ = _writer(interval=5.0)
    writer.store({"_data": "20"})
    clock.advance(5)
    writer.idle({"_data": "20"})
    assert lease.writes == [("store", "20", "fp"), ("renew",)]


def test_a_read_with_events_drops_the_unstored_idle_token():
    """The read's own token covers more; storing the older idle token at the end would be harmless
    but stale, and storing it after newer events were stored would move the checkpoint back."""
    writer, lease, _, _ = _writer()
    writer.idle({"_data": "30"})
    writer.read()
    writer.flush()
    assert lease.writes == []


def test_an_idle_token_never_moves_the_checkpoint_back():
    """The shared stream's idle token of a member can be older than the checkpoint its session
    started from (a member that joined ahead of the cursor; before the stream's own fix, a rewind
    for another member): storing it would move the checkpoint back, so only newer ones are."""
    grant = Grant("me", 3, None, Checkpoint({"_data": "05"}, None, None, None, None))
    writer, lease, clock, _ = _writer(interval=5.0, grant=grant)
    writer.idle({"_data": "03"})
    writer.flush()
    assert lease.writes == [], "older than the grant's checkpoint: kept neither for now nor for later"
    clock.advance(5)
    writer.idle({"_data": "04"})
    assert lease.writes == [("renew",)], "an interval passed: the lease is renewed, the token not stored"
    clock.advance(5)
    writer.idle({"_data": "07"})
    clock.advance(5)
    writer.idle({"_data": "06"})
    assert lease.writes == [("renew",), ("store", "07", "fp"), ("renew",)]


def test_with_an_interval_idle_tokens_move_forward_only_and_are_written_at_most_once_per_interval():
    """RELAY_CHECKPOINT_INTERVAL_MS=3000, heartbeat 1 s: an idle token is handed over at most every
    heartbeat (never an older one), and the coalescer writes the newest at most every 3 s."""
    lease, clock, stored = Lease(GRANT), Clock(), []
    coalescer = Coalescer(LeaseByLease(lease), 3.0, clock)  # type: ignore[arg-type]
    writer = CheckpointWriter(lease, "fp", clock, _timing(1.0), stored.append, coalescer)  # type: ignore[arg-type]
    writer.begin(GRANT)
    writes_at = []
    for step in range(1, 41):  # 10 s of idle reads, 4 a second, the token moving on (or back, every 5th)
        clock.advance(0.25)
        before = len(lease.writes)
        writer.idle({"_data": f"{step - 2 if step % 5 == 0 else step:03d}"})
        if lease.writes[before:] and lease.writes[-1][0] == "store":
            writes_at.append(clock.now)
    tokens = [w[1] for w in lease.writes if w[0] == "store"]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), "only forward"
    assert all(b - a >= 3.0 for a, b in zip(writes_at, writes_at[1:], strict=False)), writes_at
    assert 3 <= len(tokens) <= 4, "about one write per interval over 10 s"
    assert stored == [{"_data": t} for t in tokens], "each stored token reported once"


# ---- a valid lease keeps its session (issue 50) ----------------------------------------------------


def test_a_failed_renewal_keeps_the_session_while_the_lease_is_provably_valid():
    writer, lease, clock, _ = _writer(interval=5.0)
    start = clock.monotonic()
    assert writer.valid_until == start + TTL - 5.0, "TTL from when the lease was taken, less one heartbeat"
    lease.failing = ServerError("connection closed")
    clock.advance(5.0)
    writer.beat()  # the renewal fails: the lease is still valid for 15 s less a margin
    clock.advance(9.9)
    writer.beat()
    writer.idle(None)
    lease.failing = None
    clock.advance(1.0)
    writer.beat()
    assert lease.writes == [("renew",)], "the next attempt renewed it"
    assert writer.valid_until == start + 15.9 + TTL - 5.0, "extended from when that renewal began"


def test_renewals_failing_until_near_the_expiry_stop_the_session_before_it():
    writer, lease, clock, _ = _writer(interval=5.0)
    lease.failing = ServerError("connection closed")
    clock.advance(5.0)
    writer.beat()
    clock.advance(9.9)  # 14.9 s: valid until 15
    writer.beat()
    clock.advance(0.1)
    with pytest.raises(LeaseUnrenewedError, match="db.outbox could not be renewed .*stopped publishing 5 s before"):
        writer.beat()


def test_a_failed_checkpoint_write_keeps_the_checkpoint_held_while_the_lease_is_valid():
    writer, lease, clock, stored = _writer(interval=5.0)
    lease.failing = ServerError("write concern timed out")
    writer.store({"_data": "01"})  # written at once (nothing written yet) and failed: held
    assert lease.writes == [] and stored == []
    lease.failing = None
    clock.advance(1.0)
    writer.beat()
    assert lease.writes == [("store", "01", "fp")] and stored == [{"_data": "01"}]


def test_an_error_a_restart_would_not_cure_and_the_opening_checkpoint_fail_at_once():
    writer, lease, clock, _ = _writer(interval=5.0)
    lease.failing = RuntimeError("BadValue")
    clock.advance(5.0)
    with pytest.raises(RuntimeError):
        writer.beat()
    lease.failing = ServerError("connection closed")
    with pytest.raises(ServerError):
        writer.store({"_data": "01"}, now=True)  # the opening token: a crash must not lose it


def test_a_paused_holder_past_its_lease_does_not_survive_a_failed_renewal():
    writer, lease, clock, _ = _writer(interval=5.0)
    lease.failing = ServerError("no primary")
    clock.advance(TTL)  # paused past the lease: nothing proves it is still held
    with pytest.raises(LeaseUnrenewedError, match="stopped publishing as it may have expired"):
        writer.beat()

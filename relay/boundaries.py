"""The loop's boundaries: small interfaces it is given, never builds.

`relay.relay.Relay` talks to MongoDB, Kafka, time and its group of replicas only through these.
`relay.wiring` passes the real implementations (pymongo's change stream, confluent-kafka's
producer, the lease document, the system clock, the group's balancing); the fast loop tests pass
in-memory fakes (tests/unit/fakes.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from relay.changes import Batch, StartPoint
from relay.encoding import OutgoingMessage
from relay.lease import Checkpoint, Grant
from relay.window import Delivery

Token = Mapping[str, Any]


class ChangeSource(Protocol):
    """The outbox's change stream (relay.changes.ChangeSource)."""

    def open(self, start: StartPoint) -> None:
        """Open the stream at `start`; raises HistoryLostError when that point left the oplog."""

    def rescan(self) -> None:
        """Open the stream at "now", then serve every outbox document as a batch without a token,
        then an empty batch carrying the stream's opening token (RELAY_ON_HISTORY_LOST=rescan)."""

    @property
    def token(self) -> Token | None:
        """The stream's current token (the opening post-batch token right after `open`)."""

    def next_batch(self, max_events: int) -> Batch:
        """The changes available now, at most `max_events`, and the token that covers exactly
        them and everything before; waits at most about RELAY_MAX_AWAIT_MS when none are."""

    def close(self) -> None:
        """Release the stream; safe to call twice."""


class Publisher(Protocol):
    """One producer instance (relay.publisher.Publisher, or in exactly-once mode
    relay.transactions.TransactionalPublisher, whose `send` is one committed transaction); a new
    one per leading session."""

    def send(self, delivery: Delivery, while_waiting: Callable[[], None]) -> None:
        """Hand every message of `delivery` to the producer, its reports to `delivery.on_delivery`
        (blocking, and calling `while_waiting`, only while the producer's queue is full)."""

    def poll(self, timeout: float) -> None:
        """Run the delivery callbacks that are due, waiting up to `timeout` for one."""

    def failure(self, delivery: Delivery) -> Exception:
        """The error for the first failed report of `delivery` (classified by relay.errors)."""

    @property
    def queued(self) -> int:
        """Messages still awaiting a delivery report."""

    def close(self) -> None:
        """Drop whatever is queued or in flight (nothing in it was checkpointed)."""


class ResumePoint(Protocol):
    """Where a new leading session resumes (the loop's `resume` hook).

    Called once per session, after its publisher was made and before the stream opens, with the
    session's publisher, its lease grant and a heartbeat to call while it waits. The default is
    the lease document's checkpoint; exactly-once mode (relay.transactions) fences every earlier
    producer of the lease first, then takes the newer of that checkpoint and the offsets topic's
    newest committed record."""

    def __call__(self, publisher: Publisher, grant: Grant, heartbeat: Callable[[], None]) -> Checkpoint: ...


def checkpoint_of_lease(_publisher: Publisher, grant: Grant, _heartbeat: Callable[[], None]) -> Checkpoint:
    """The default ResumePoint: the checkpoint stored in the lease document."""
    return grant.checkpoint


class LeaseStore(Protocol):
    """The lease, its fencing token and the fenced checkpoint (relay.lease.LeaseStore)."""

    def try_acquire(self) -> Grant | None:
        """Take or renew the lease; None while another owner holds an unexpired one."""

    def renew(self, grant: Grant) -> None:
        """Extend the lease; raises LeaseLostError if the fencing token is no longer current."""

    def commit(self, grant: Grant, token: Token, fingerprint: str) -> None:
        """Store `token` as the checkpoint, fenced like `renew`."""

    def release(self, grant: Grant) -> None:
        """Give the lease up so a standby can take it at once."""

    def announce(self, role: str) -> None:
        """Record this replica's role for `status` (best effort)."""


class Encoder(Protocol):
    """Turns a change into its Kafka message (relay.encoding.MessageBuilder)."""

    def build(self, change: Any, fencing_token: int) -> OutgoingMessage:
        """The message for one insert change; raises PoisonEventError naming the event."""

    def build_many(self, changes: Sequence[Any], fencing_token: int) -> list[OutgoingMessage | None]:
        """Messages for a batch where a fast path can build them; None where `build` must."""

    def dead_letter(self, change: Any, reason: str, fencing_token: int) -> OutgoingMessage:
        """The dead-letter record that stands in for a poison event."""


class Observer(Protocol):
    """What the loop reports (relay.observe.Observer)."""

    def tick(self) -> None: ...
    def role(self, role: str, fencing_token: int | None) -> None: ...
    def watch_publisher(self, publisher: Any) -> None: ...
    def published(self, wall_ms: Sequence[int], messages: Sequence[OutgoingMessage], seconds: float,
                  token: Token | None) -> None: ...
    def committed(self, token: Any) -> None: ...
    def resumed(self) -> None: ...
    def dead_lettered(self, event_id: str, reason: str) -> None: ...
    def restart(self, exc: BaseException, delay_s: float) -> None: ...
    def lease_lost(self, exc: BaseException) -> None: ...
    def stopped(self, exc: BaseException) -> None: ...


class Assignment(Protocol):
    """Whether this relay should lead its lease now: the share of a group of replicas over the
    partitions of one outbox (relay.group). A relay alone on an outbox uses `ALWAYS`."""

    def may_lead(self) -> bool:
        """Asked on every standby pass, before trying the lease: False skips the attempt."""

    def led(self, held: bool) -> None:
        """The relay now holds the lease (True), or no longer does (False: none was free, it was
        lost, handed over or released on stop)."""

    def hand_over(self) -> bool:
        """Asked by a leader between steps: True to hand the lease over now (settle what is in
        flight, store the final checkpoint, release the lease, go back to standby)."""


class Always:
    """The assignment of a relay alone on its outbox: always try the lease, never hand it over."""

    def may_lead(self) -> bool:
        return True

    def led(self, held: bool) -> None:
        pass

    def hand_over(self) -> bool:
        return False


ALWAYS = Always()


class Clock(Protocol):
    """Time as the loop sees it: a monotonic clock and an interruptible wait."""

    def monotonic(self) -> float: ...

    def wait(self, seconds: float, until: threading.Event) -> None:
        """Sleep `seconds`, or less if `until` is set meanwhile."""


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float, until: threading.Event) -> None:
        if seconds > 0:
            until.wait(seconds)

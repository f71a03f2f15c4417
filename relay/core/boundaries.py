"""The loop's boundaries: small interfaces it is given, never builds.

`relay.core.loop.Relay` talks to MongoDB, Kafka, time and its group of replicas only through
these. `relay.wiring` passes the real implementations (relay.mongo's change source and lease
document, relay.kafka's delivery modes, relay.avro's message builder, relay.ops' observer, the
system clock, relay.group's balancing); the fast loop tests pass in-memory fakes
(tests/unit/fakes.py). Nothing here imports a driver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from relay.core.change import Batch, Change
from relay.core.errors import Action
from relay.core.message import OutgoingMessage
from relay.core.positions import CheckpointWrite, Grant, StartPoint, Token
from relay.core.resume import Committed
from relay.core.window import Parcel


class ChangeSource(Protocol):
    """A scope's change stream (relay.mongo.subscription.Subscription, over the process's shared stream)."""

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

    def ready(self, timeout: float) -> bool:
        """Whether `next_batch` can return without waiting on the server, waiting up to `timeout`
        seconds for the read in flight to come back (asked only while a transaction is open)."""

    def close(self) -> None:
        """Release the stream; safe to call twice."""


class Publisher(Protocol):
    """One producer instance of one leading session (relay.kafka.producer.IdempotentPublisher, or in
    exactly-once mode relay.kafka.transactions.TransactionalPublisher, which adds each parcel to
    the open Kafka transaction and reports it only once that transaction committed)."""

    def send(self, parcel: Parcel, while_waiting: Callable[[], None]) -> None:
        """Hand every message of `parcel` to the producer, its reports to `parcel.on_delivery`
        (blocking, and calling `while_waiting`, only while the producer's queue is full)."""

    def poll(self, timeout: float) -> None:
        """Run the delivery callbacks that are due, waiting up to `timeout` for one."""

    def drain(self, timeout: float) -> None:
        """Like `poll`, for when the loop waits for every report: send at once whatever the
        producer holds back to fill a batch (linger.ms), then wait up to `timeout` for them all."""

    def due_in(self) -> float | None:
        """How long the loop may wait for its next read before it must `drain` (it drains when
        the read is not ready within that time; at zero or less, at once); None: wait as long as
        the read takes, nothing is held open (at-least-once: always None). Exactly-once has two
        meanings, by whether a commit is in flight:
        - none in flight: seconds until the open transaction must commit (RELAY_TRANSACTION_MAX_MS
          after its first parcel was handed over); None when no parcel is open;
        - one in flight: seconds until the parcels handed over meanwhile (waiting for it, not
          produced yet) have waited RELAY_TRANSACTION_MAX_MS since the first of them, or that whole
          bound when none waits; the loop reads on meanwhile rather than drain (which would wait
          for the commit and end their wait with a transaction of their own), and the commit's
          own parcels are released at its next `send`, `poll` or `drain` after it ended."""

    def failure(self, parcel: Parcel) -> Exception:
        """The error for the first failed report of `parcel` (it carries its action)."""

    @property
    def queued(self) -> int:
        """Messages still awaiting a delivery report."""

    def close(self) -> None:
        """Drop whatever is queued or in flight (nothing in it was checkpointed)."""


class DeliveryMode(Protocol):
    """The Kafka side of every leading session: the delivery mode (relay.kafka.modes). It supplies
    the inputs of the resume decision that live in Kafka and carries out its Kafka actions; the
    decision is relay.core.resume's, made by the loop. Each call gets a heartbeat to call while it
    waits on the broker.
    """

    @property
    def name(self) -> str:
        """RELAY_DELIVERY: `at-least-once` or `exactly-once`."""

    @property
    def offsets_topic(self) -> str:
        """RELAY_OFFSETS_TOPIC, named in errors about its records."""

    def start(self, grant: Grant, heartbeat: Callable[[], None]) -> Publisher:
        """A fresh producer for the session of `grant`, called once per session after the lease
        was taken. Exactly-once mode fences every earlier producer of the lease first, so nothing
        commits after `committed_record()` reads. The loop closes the producer when the session ends;
        `start` closes it itself if it fails."""

    def committed_record(self, heartbeat: Callable[[], None]) -> Committed | None:
        """The lease's newest committed offsets record (None: none, a tombstone, or no offsets
        topic); called after `start`, at most once per session, only where the decision needs it."""

    def forget(self, publisher: Publisher, heartbeat: Callable[[], None]) -> None:
        """Tombstone the lease's offsets record with the session's `publisher` (exactly-once mode
        only, when the decision says so, before the stream opens)."""


class Broker(Protocol):
    """What a broker package supplies to the process (relay.kafka.broker.Kafka,
    relay.nats.broker.JetStream), chosen once by RELAY_BROKER in relay.wiring; the loop sees only
    each lease's `DeliveryMode` and its sessions' `Publisher`. docs/architecture.md ("Brokers")
    says what each must guarantee: a publish acknowledged only once the broker stored it, order
    kept per aggregate, a duplicate the consumers can tell (the event id), and fencing."""

    name: str

    def check_settings(self) -> None:
        """At start, before any server: the client accepts the configuration (ConfigError)."""

    def check_servers(self) -> None:
        """At start: the broker answers, takes the credentials, and holds what the relay needs
        (topics, a stream, an exchange ...): a stopping error naming what is missing."""

    def mode(self, lease_id: str, fingerprint: str) -> DeliveryMode:
        """The delivery mode of one lease: a fresh publisher per leading session."""

    def action_for(self, exc: BaseException) -> Action | None:
        """What the loop does after an exception of this broker's client (None: not one)."""

    def close(self) -> None:
        """Release what the process holds for this broker (an event loop, connections)."""


class LeaseStore(Protocol):
    """The lease, its fencing token and the fenced checkpoint (relay.mongo.lease.LeaseStore)."""

    @property
    def lease_id(self) -> str:
        """The identity of the lease (its document's `_id`)."""

    def try_acquire(self) -> Grant | None:
        """Take or renew the lease; None while another owner holds an unexpired one."""

    def renew(self, grant: Grant) -> None:
        """Extend the lease; raises LeaseLostError if the fencing token is no longer current."""

    def store_checkpoint(self, grant: Grant, token: Token, fingerprint: str) -> None:
        """Store `token` as the checkpoint, fenced like `renew`."""

    def release(self, grant: Grant) -> None:
        """Give the lease up so a standby can take it at once."""


class CheckpointStore(Protocol):
    """Where the checkpoints of the scopes one process leads are written, several at once
    (relay.mongo.checkpoints.MongoCheckpointStore: one MongoDB transaction over their lease
    documents; relay.core.coalescer.LeaseByLease for a loop run alone).
    relay.core.coalescer.Coalescer decides when, and which checkpoints go together."""

    def store(self, checkpoints: Sequence[CheckpointWrite]) -> set[str]:
        """Store `checkpoints` in one fenced, majority-acknowledged write: each only while its
        grant's owner and fencing token are still current (its lease renewed with it). Returns the
        lease ids refused for that (their leases were lost); every other checkpoint is stored.
        Raises on any other failure, having stored none of them."""


class Encoder(Protocol):
    """Turns a change into its Kafka message (relay.avro.encoding.MessageBuilder)."""

    def build(self, change: Change, fencing_token: int) -> OutgoingMessage:
        """The message for one change; raises PoisonEventError naming the event."""

    def build_many(self, changes: Sequence[Change], fencing_token: int) -> list[OutgoingMessage | None]:
        """Messages for a batch where a fast path can build them; None where `build` must."""

    def dead_letter(self, change: Change, reason: str, fencing_token: int) -> OutgoingMessage:
        """The dead-letter record that stands in for a poison event."""


class LoopObserver(Protocol):
    """What the loop reports (relay.ops.observe.ScopeObserver)."""

    def tick(self) -> None: ...
    def role(self, role: str, fencing_token: int | None) -> None: ...
    def watch_publisher(self, publisher: Any) -> None: ...
    def published(
        self,
        wall_ms: Sequence[int],
        messages: Sequence[OutgoingMessage],
        seconds: float,
        token: Token | None,
        read_seconds: float,
    ) -> None:
        """Kafka acknowledged a parcel: its changes' commit times, its messages, the seconds
        since it was handed to the producer and since its changes were read, its token."""

    def checkpoint_stored(self, token: Any) -> None: ...
    def resumed(self) -> None: ...
    def dead_lettered(self, event_id: str, reason: str) -> None: ...
    def restart(self, exc: BaseException, delay_s: float) -> None: ...
    def lease_lost(self, exc: BaseException) -> None: ...
    def stopped(self, exc: BaseException) -> None: ...


class Assignment(Protocol):
    """Whether this relay should lead its lease now: the share of a group of replicas over the
    partitions of one outbox (relay.group.balance; with one partition: always try, never hand
    over). A loop run without a group (tests) uses `ALWAYS`."""

    def may_lead(self) -> bool:
        """Asked on every standby pass, before trying the lease: False skips the attempt."""

    def led(self, held: bool) -> None:
        """The relay now holds the lease (True), or no longer does (False: none was free, it was
        lost, handed over or released on stop)."""

    def hand_over(self) -> bool:
        """Asked by a leader between steps: True to hand the lease over now (settle what is in
        flight, store the final checkpoint, release the lease, go back to standby)."""


class Always:
    """An assignment that always tries the lease and never hands it over (a loop without a group)."""

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

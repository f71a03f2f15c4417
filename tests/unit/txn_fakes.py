"""In-memory fakes of exactly-once mode's boundaries, on the `World` of tests/unit/fakes.py.

`TxnLog` is the broker's view of one lease's transactional id: every message appended (what a
read_uncommitted consumer sees), which transactions committed (what a read_committed consumer
sees), the offsets topic's records (visible once their transaction committed) and the producer
epoch (each `init_transactions` bumps it; a producer of an older epoch can commit nothing).

`FakeTxnPublisher` is a transactional producer on it: `send()` adds a parcel to the open
transaction (append the messages; at commit the offsets record, checking the epoch), `fence()`
bumps the epoch and `forget_record()` commits a tombstone, like
relay.kafka.transactions.TransactionalPublisher; where to resume is the loop's own decision
(relay.core.resume), with the record `FakeTxnDeliveryMode.committed` reads.
A transaction spans parcels (reads) until its bounds or a drain commit it, as in the real one.
With `background_commits`, a commit's end is seen at the loop's second poll after it (or a drain),
and parcels sent meanwhile wait for it, as with the real publisher's commit thread.
Faults: `crash_inside` kills the process halfway through a parcel's messages (the open
transaction may hold earlier reads), `crash_between_reads` as a read joins a transaction that
holds earlier reads, `crash_after_commit` right after a commit (before the MongoDB write); all raise `Crashed`, a
BaseException that no `except Exception` of the loop catches, as a SIGKILL would end it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from relay.config import Settings
from relay.core.change import Batch
from relay.core.errors import ProducerFencedError, TransactionAbortedError
from relay.core.loop import Relay
from relay.core.message import HEADER_FENCING
from relay.core.positions import Checkpoint, Grant
from relay.core.window import Parcel
from relay.kafka.offsets_record import OffsetsRecord
from relay.kafka.producer import parcel_failure
from relay.kafka.transactions import aborted_failure
from relay.ops.observe import ScopeObserver
from tests.unit.fakes import (
    FINGERPRINT,
    FakeLease,
    FakePublisher,
    FakeSource,
    World,
    _Report,
    covered_by,
    relay_on,
    token,
)
from tests.unit.machine import Crashed

LEASE_ID = "app.outbox"
TOPIC = "outbox-relay.offsets"


@dataclass
class TxnMessage:
    event_id: str
    key: bytes
    topic: str
    fencing: int
    txn: int


@dataclass
class TxnLog:
    epoch: int = 0
    next_txn: int = 0
    log: list[TxnMessage] = field(default_factory=list)
    records: list[tuple[int, bytes | None]] = field(default_factory=list)  # (txn, value) of the offsets topic
    committed_txns: set[int] = field(default_factory=set)
    crash_inside: bool = False
    crash_after_commit: bool = False
    crash_between_reads: bool = False  # killed as a read joins a transaction that holds earlier reads
    # Commits end in the background, as the real publisher's do: the broker commits at once, the
    # loop sees it at its second poll after (or a drain); parcels sent meanwhile wait, not appended.
    background_commits: bool = False
    commits_by_stale_fencing: int = 0  # commits whose messages carry a fencing token older than the lease's

    def committed(self) -> list[TxnMessage]:
        """What a read_committed consumer sees, in append order."""
        return [m for m in self.log if m.txn in self.committed_txns or m.txn < 0]

    def newest_record(self) -> OffsetsRecord | None:
        visible = [value for txn, value in self.records if txn in self.committed_txns]
        if not visible or visible[-1] is None:
            return None
        return OffsetsRecord.decode(LEASE_ID, visible[-1], f"{TOPIC}[0]")


def calm_world() -> World:
    """A world whose change stream returns whole batches (deterministic tests)."""
    world = World()
    world.whole_batches = True  # type: ignore[attr-defined]
    return world


def txn_log(world: World) -> TxnLog:
    if not hasattr(world, "txn"):
        world.txn = TxnLog()  # type: ignore[attr-defined]
    return world.txn  # type: ignore[attr-defined,no-any-return]


class FakeTxnPublisher:
    """A transactional producer on the world's TxnLog (relay.core.boundaries.Publisher), with
    transactions spanning parcels like relay.kafka.transactions.TransactionalPublisher: a
    parcel joins the open transaction and is held (not acknowledged) until that transaction
    commits, once it holds `max_events` events or `max_bytes` bytes, was open `max_ms` on the
    world's clock, or the loop drains."""

    def __init__(self, world: World, settings: Settings) -> None:
        self.world = world
        self.epoch = -1
        self.grant: Grant | None = None
        self.max_events = settings.transaction_max_events
        self.max_bytes = settings.transaction_max_bytes
        self.max_ms = settings.transaction_max_ms
        self.txn: int | None = None  # the open transaction
        self.open: list[Parcel] = []
        self.appended: list[TxnMessage] = []
        self.events = self.bytes = 0
        self.opened_at = 0.0
        # A commit the broker ended that the loop has not seen yet (None: none; True: committed;
        # or its error), and the parcels sent meanwhile.
        self.ending: bool | Exception | None = None
        self.unseen_polls = 0  # polls that still find that commit in flight
        self.waiting: list[Parcel] = []

    def fence(self, grant: Grant) -> None:
        t = txn_log(self.world)
        t.epoch += 1  # init_transactions: every earlier producer of the lease is fenced
        self.epoch = t.epoch
        self.grant = grant

    def forget_record(self) -> None:
        assert self.grant is not None, "fence() first"
        self._commit(self._begin(), [], [None])  # a tombstone

    def _begin(self) -> int:
        t = txn_log(self.world)
        t.next_txn += 1
        return t.next_txn

    def _commit(self, txn: int, messages: list[TxnMessage], records: list[bytes | None]) -> None:
        t, w = txn_log(self.world), self.world
        t.records += [(txn, value) for value in records]
        if self.epoch != t.epoch:
            raise ProducerFencedError(f"fenced: epoch {self.epoch}, the lease's producer is at {t.epoch}")
        t.committed_txns.add(txn)
        w.broker.acked.update(m.event_id for m in messages)
        if any(m.fencing != w.lease.fencing for m in messages):
            t.commits_by_stale_fencing += 1

    def send(self, parcel: Parcel, while_waiting: Callable[[], None]) -> None:
        assert self.grant is not None, "fence() first"
        parcel.hold()
        if self.ending is not None:  # a commit in flight: the parcel waits, held, not appended
            self.waiting.append(parcel)
            return
        self._add(parcel)

    def _add(self, parcel: Parcel) -> None:
        w, t = self.world, txn_log(self.world)
        if self.txn is None:
            self.txn, self.opened_at = self._begin(), w.clock.monotonic()
        if t.crash_between_reads and self.open:
            t.crash_between_reads = False
            raise Crashed("killed after some reads of an open transaction")
        self.open.append(parcel)
        failed = False
        for i, m in enumerate(parcel.messages):
            if t.crash_inside and i >= len(parcel.messages) // 2:
                t.crash_inside = False
                raise Crashed("killed inside a transaction")
            if failed:  # the rest of a failed transaction is purged by the abort
                parcel.on_delivery(KafkaError(KafkaError._PURGE_QUEUE), _Report(m))
                continue
            if (m.topic, m.event_id) in w.broker.refuse:
                parcel.on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Report(m))
                failed = True
                continue
            fencing = int(dict(m.headers)[HEADER_FENCING])
            self.appended.append(TxnMessage(m.event_id, m.key, m.topic, fencing, self.txn))
            t.log.append(self.appended[-1])
            if w.broker.fail_next:
                w.broker.fail_next -= 1
                parcel.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), _Report(m))
                failed = True
                continue
            parcel.on_delivery(None, _Report(m))
        if failed:  # abortable: abort (nothing of it visible), then the first failed report decides
            raise self._aborted()
        self.events += len(parcel.messages)
        self.bytes += sum(len(m.value) for m in parcel.messages)
        if self.events > self.max_events:
            w.violate(f"{self.events} events in one transaction, more than {self.max_events}")
        if self.events >= self.max_events or self.bytes >= self.max_bytes:
            self._commit_open(t.background_commits)
        else:
            self._commit_if_due()

    def _aborted(self) -> Exception:
        parcels = self.open
        error = aborted_failure(parcels) or TransactionAbortedError("aborted")
        self._forget(failed=True)
        return error

    def _forget(self, failed: bool) -> None:
        stand_in = (b"", KafkaError(KafkaError._PURGE_QUEUE)) if failed else None
        for d in self.open:
            d.release(stand_in)
        self.txn, self.open, self.appended, self.events, self.bytes = None, [], [], 0, 0
        if failed:  # nothing waiting for a failed commit is appended either
            for d in self.waiting:
                d.release(stand_in)
            self.waiting, self.ending = [], None

    def _commit_open(self, background: bool = False) -> None:
        if self.txn is None or not self.open:
            return
        assert self.grant is not None
        newest = next((d.token for d in reversed(self.open) if d.token is not None), None)
        records: list[bytes | None] = [] if newest is None else [OffsetsRecord(
            LEASE_ID, newest, FINGERPRINT, self.grant.fencing_token, self.grant.owner).encode()]
        try:
            self._commit(self.txn, self.appended, records)
        except ProducerFencedError as exc:
            if not background:
                self._forget(failed=True)
                raise
            self.ending, self.unseen_polls = exc, 1
            return
        self.ending = True
        self.unseen_polls = 1  # the loop's next poll still finds it in flight
        if not background:
            self._end()

    def _end(self) -> None:
        """The loop sees the commit end: release its parcels (or raise its error), then append the
        parcels that waited for it to the next transaction."""
        ending, self.ending = self.ending, None
        if isinstance(ending, Exception):
            self._forget(failed=True)  # the waiting parcels too
            raise ending
        self._forget(failed=False)
        t = txn_log(self.world)
        if t.crash_after_commit:
            t.crash_after_commit = False
            raise Crashed("killed between the Kafka commit and the MongoDB write")
        while self.waiting and self.ending is None:  # a bound reached: the rest wait for that one
            self._add(self.waiting.pop(0))

    def due_in(self) -> float | None:
        if self.ending is not None:
            return 0.0
        if not self.open:
            return None
        return self.opened_at + self.max_ms / 1000 - self.world.clock.monotonic()

    def _commit_if_due(self) -> None:
        due = self.due_in()
        if self.ending is None and due is not None and due <= 0:
            self._commit_open(txn_log(self.world).background_commits)

    def poll(self, timeout: float) -> None:
        if self.ending is not None:
            if self.unseen_polls > 0:  # still in flight for this poll
                self.unseen_polls -= 1
                return
            self._end()
        self._commit_if_due()

    def drain(self, timeout: float) -> None:
        while self.ending is not None or self.open:
            if self.ending is not None:
                self._end()
            else:
                self._commit_open()

    def failure(self, parcel: Parcel) -> Exception:
        return parcel_failure(parcel)

    @property
    def queued(self) -> int:
        return 0

    def close(self) -> None:
        self._forget(failed=True)  # the open transaction stays uncommitted: the next init_transactions aborts it


class DeliveryLease(FakeLease):
    """FakeLease that also stores the delivery mode beside the checkpoint, as relay.mongo.lease does."""

    def __init__(self, world: World, owner: str, ttl_s: float, delivery: str) -> None:
        super().__init__(world, owner, ttl_s)
        self.delivery = delivery

    def try_acquire(self) -> Grant | None:
        grant = super().try_acquire()
        if grant is None:
            return None
        delivery = getattr(self.world.lease, "delivery", None)
        return Grant(grant.owner, grant.fencing_token, grant.expires_at,
                     Checkpoint(grant.checkpoint.token, None, grant.checkpoint.fingerprint, delivery))

    def store_checkpoint(self, grant: Grant, tok: Any, fingerprint: str) -> None:
        super().store_checkpoint(grant, tok, fingerprint)
        self.world.lease.delivery = self.delivery  # type: ignore[attr-defined]


class TxnSource(FakeSource):
    """The fake change stream; it checks a leader opens right after the last event a
    read_committed consumer sees (or at the MongoDB checkpoint when that is newer: an idle
    heartbeat), and anywhere else is a violation. In a world with `whole_batches` set, a read
    returns everything there is (up to the limit), for tests that count batches."""

    def next_batch(self, max_events: int) -> Batch:
        if not getattr(self.world, "whole_batches", False):
            return super().next_batch(max_events)
        assert self.position is not None, "open() first"
        changes = self.world.outbox.changes[self.position:self.position + max_events]
        self.position += len(changes)
        return Batch(list(changes), token(self.position))

    def open(self, start: Any) -> None:
        w, t = self.world, txn_log(self.world)
        expected = w.lease.token
        record = t.newest_record()
        if expected is not None and record is not None and covered_by(record.token) > covered_by(expected):
            expected = dict(record.token)
        saved, w.lease.token = w.lease.token, expected
        try:
            super().open(start)  # compares with w.lease.token
        finally:
            w.lease.token = saved


class FakeTxnDeliveryMode:
    """The two delivery modes on the fakes (relay.core.boundaries.DeliveryMode), like
    relay.kafka.modes: exactly-once, a FakeTxnPublisher fenced at start; at-least-once, the
    FakePublisher. Both read the fake offsets topic's newest committed record when the loop's
    resume decision asks (`reads` counts it), and exactly-once forgets it when told."""

    offsets_topic = TOPIC

    def __init__(self, world: World, settings: Settings) -> None:
        self.world = world
        self.settings = settings
        self.name = settings.delivery
        self.publishers: list[Any] = []
        self.reads = 0

    def start(self, grant: Grant, heartbeat: Callable[[], None]) -> Any:
        if self.name == "exactly-once":
            publisher = FakeTxnPublisher(self.world, self.settings)
            publisher.fence(grant)
        else:
            publisher = FakePublisher(self.world)
        self.publishers.append(publisher)
        return publisher

    def committed_record(self, heartbeat: Callable[[], None]) -> OffsetsRecord | None:
        self.reads += 1
        return txn_log(self.world).newest_record()

    def forget(self, publisher: Any, heartbeat: Callable[[], None]) -> None:
        assert isinstance(publisher, FakeTxnPublisher), "only an exactly-once relay forgets a record"
        publisher.forget_record()


@dataclass
class TxnRelay:
    relay: Relay
    publishers: list[Any]


def txn_relay(world: World, settings: Settings, observer: ScopeObserver | None = None) -> TxnRelay:
    """A real `Relay` with the real MessageBuilder on the fakes, in the mode `settings.delivery`
    names (FakeTxnDeliveryMode)."""
    producers = FakeTxnDeliveryMode(world, settings)
    lease = DeliveryLease(world, settings.instance_id, settings.lease_ttl_s, settings.delivery)
    relay = relay_on(world, settings, producers, lambda: TxnSource(world), lease, observer)
    return TxnRelay(relay, producers.publishers)

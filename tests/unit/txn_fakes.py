"""In-memory fakes of exactly-once mode's boundaries, on the `World` of tests/unit/fakes.py.

`TxnLog` is the broker's view of one lease's transactional id: every message appended (what a
read_uncommitted consumer sees), which transactions committed (what a read_committed consumer
sees), the offsets topic's records (visible once their transaction committed) and the producer
epoch (each `init_transactions` bumps it; a producer of an older epoch can commit nothing).

`FakeTxnPublisher` is a transactional producer on it: `send()` runs one transaction (append the
messages, then the offsets record, then commit, checking the epoch), `resume_point()` fences and
reads like relay.kafka.transactions.TransactionalPublisher, with the same pure rules (relay.kafka.offsets_record).
Faults: `crash_inside` kills the process halfway through a transaction's messages,
`crash_after_commit` right after a commit (before the MongoDB write); both raise `Crashed`, a
BaseException that no `except Exception` of the loop catches, as a SIGKILL would end it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from relay.config import Settings
from relay.core.errors import ProducerFencedError
from relay.core.loop import Relay
from relay.core.message import HEADER_FENCING
from relay.core.positions import Batch, Checkpoint, Grant
from relay.core.resume import after_exactly_once, forgets_record, resume_point
from relay.core.window import Delivery
from relay.kafka.offsets_record import OffsetsRecord
from relay.kafka.producer import delivery_failure
from relay.ops.observe import Observer
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
    """A transactional producer on the world's TxnLog (relay.core.boundaries.Publisher)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.epoch = -1
        self.grant: Grant | None = None

    def resume_point(self, grant: Grant, heartbeat: Callable[[], None]) -> Checkpoint:
        t = txn_log(self.world)
        t.epoch += 1  # init_transactions: every earlier producer of the lease is fenced
        self.epoch = t.epoch
        self.grant = grant
        record = t.newest_record()
        if forgets_record(grant.checkpoint, record):
            self._commit(self._begin(), [], [None])  # a tombstone
        return resume_point(grant.checkpoint, record, FINGERPRINT, TOPIC)

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

    def send(self, delivery: Delivery, while_waiting: Callable[[], None]) -> None:
        assert self.grant is not None, "resume_point() first"
        w, t = self.world, txn_log(self.world)
        txn = self._begin()
        appended: list[TxnMessage] = []
        failed = False
        for i, m in enumerate(delivery.messages):
            if t.crash_inside and i >= len(delivery.messages) // 2:
                t.crash_inside = False
                raise Crashed("killed inside a transaction")
            if failed:  # the rest of a failed transaction is purged by the abort
                delivery.on_delivery(KafkaError(KafkaError._PURGE_QUEUE), _Report(m))
                continue
            if (m.topic, m.event_id) in w.broker.refuse:
                delivery.on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Report(m))
                failed = True
                continue
            fencing = int(dict(m.headers)[HEADER_FENCING])
            appended.append(TxnMessage(m.event_id, m.key, m.topic, fencing, txn))
            t.log.append(appended[-1])
            if w.broker.fail_next:
                w.broker.fail_next -= 1
                delivery.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), _Report(m))
                failed = True
                continue
            delivery.on_delivery(None, _Report(m))
        if failed:  # abortable: abort (nothing of it visible), then the first failed report decides
            raise delivery_failure(delivery)
        records: list[bytes | None] = [] if delivery.token is None else [OffsetsRecord(
            LEASE_ID, delivery.token, FINGERPRINT, self.grant.fencing_token, self.grant.owner).encode()]
        self._commit(txn, appended, records)
        if t.crash_after_commit:
            t.crash_after_commit = False
            raise Crashed("killed between the Kafka commit and the MongoDB write")

    def poll(self, timeout: float) -> None:
        pass

    def drain(self, timeout: float) -> None:
        pass

    def failure(self, delivery: Delivery) -> Exception:
        return delivery_failure(delivery)

    @property
    def queued(self) -> int:
        return 0

    def close(self) -> None:
        pass  # an open transaction stays uncommitted: the next init_transactions aborts it


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

    def commit(self, grant: Grant, tok: Any, fingerprint: str) -> None:
        super().commit(grant, tok, fingerprint)
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


class FakeTxnProducers:
    """The two delivery modes on the fakes (relay.core.boundaries.Producers): exactly-once, a
    FakeTxnPublisher that fences and resumes like relay.kafka.modes.ExactlyOnce; at-least-once,
    the FakePublisher resuming after the newer of the checkpoint and the fake offsets topic's
    record when the checkpoint was stored in exactly-once mode (relay.kafka.modes.AtLeastOnce)."""

    def __init__(self, world: World, exactly_once: bool) -> None:
        self.world = world
        self.exactly_once = exactly_once
        self.publishers: list[Any] = []

    def start(self, grant: Grant, heartbeat: Callable[[], None]) -> tuple[Any, Checkpoint]:
        if self.exactly_once:
            publisher = FakeTxnPublisher(self.world)
            self.publishers.append(publisher)
            return publisher, publisher.resume_point(grant, heartbeat)
        self.publishers.append(FakePublisher(self.world))
        return self.publishers[-1], after_exactly_once(grant.checkpoint, txn_log(self.world).newest_record,
                                                       FINGERPRINT, TOPIC)


@dataclass
class TxnRelay:
    relay: Relay
    publishers: list[Any]


def txn_relay(world: World, settings: Settings, observer: Observer | None = None) -> TxnRelay:
    """A real `Relay` with the real MessageBuilder on the fakes, in the mode `settings.delivery`
    names (FakeTxnProducers)."""
    producers = FakeTxnProducers(world, settings.delivery == "exactly-once")
    lease = DeliveryLease(world, settings.instance_id, settings.lease_ttl_s, settings.delivery)
    relay = relay_on(world, settings, producers, lambda: TxnSource(world), lease, observer)
    return TxnRelay(relay, producers.publishers)

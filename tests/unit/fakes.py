"""In-memory fakes of the loop's boundaries (relay.core.boundaries), sharing one `World`.

The world holds an outbox (a list of events, each with its resume token), a broker (partitions,
the messages appended to them, the events whose report came back successful), one lease document
and a clock. The fakes record every breach of a guarantee they can see, so tests assert on
`world.violations`:
- a commit whose token covers an event without a successful delivery report (guarantee 1);
- a checkpoint that moves backwards (guarantee 4);
- more unacknowledged messages than RELAY_BATCH_MAX_EVENTS (guarantee 7), or more messages sent
  with a stale fencing token after a takeover than that (a zombie stops within one batch);
- a stream opened anywhere but at the stored checkpoint (a failure replays from it).
Tokens are `{"_data": "82<8 hex digits: events covered>00000001"}`: event i's own token covers
events 0..i, so it is the token "after" it.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId, Timestamp
from confluent_kafka import KafkaError

from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.change import Batch, Change
from relay.core.coalescer import Coalescer, LeaseByLease
from relay.core.errors import HistoryLostError, LeaseLostError
from relay.core.loop import Relay
from relay.core.message import HEADER_FENCING
from relay.core.partitions import Scope
from relay.core.positions import Checkpoint, Grant, StartPoint
from relay.core.window import Parcel
from relay.kafka.producer import parcel_failure
from relay.ops.observe import ProcessObserver, ScopeObserver
from relay.wiring import message_builder
from tests.changes import change_value

FOLDER = SchemaFolder.bundled()
FINGERPRINT = "fake-pipeline"
AWAIT_S = 0.2  # how long an empty read waits (RELAY_MAX_AWAIT_MS)
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def token(covered: int) -> dict[str, str]:
    """The resume token after the first `covered` events."""
    return {"_data": f"82{covered:08X}00000001"}


def covered_by(tok: Any) -> int:
    return int(tok["_data"][2:10], 16)


def outbox_document(seq: int, key: str, **overrides: Any) -> dict[str, Any]:
    doc = {"_id": ObjectId(), "aggregateType": "order", "aggregateId": key, "eventType": "Changed",
           "payload": {"seq": seq}, "occurredAt": EPOCH + dt.timedelta(milliseconds=seq)}
    doc.update(overrides)
    return {k: v for k, v in doc.items() if v is not None}


# ---- the world ----------------------------------------------------------------------------------

@dataclass
class Clock:
    """Fake time: only `wait` and tests move it."""

    now: float = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wait(self, seconds: float, until: threading.Event) -> None:
        self.now += max(seconds, 0.0)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Outbox:
    changes: list[Change] = field(default_factory=list)

    def add(self, doc: dict[str, Any]) -> Change:
        """Append the insert of `doc`, as the change source hands it over."""
        n = len(self.changes)
        change = change_value(doc, token(n + 1), Timestamp(1_767_225_600 + n, 1), EPOCH + dt.timedelta(milliseconds=n))
        self.changes.append(change)
        return change

    def event_ids(self) -> list[str]:
        return [c.event_id for c in self.changes]


@dataclass
class Appended:
    """A message as the broker holds it."""

    event_id: str
    key: bytes
    topic: str
    fencing: int


@dataclass
class Broker:
    partitions: int = 3
    log: dict[int, list[Appended]] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)  # events with a successful report to the relay
    fail_next: int = 0  # how many of the next reports fail (transient: message timed out)
    refuse: set[tuple[str, str]] = field(default_factory=set)  # (topic, event id) refused for good (too large)

    def partition(self, key: bytes) -> int:
        return zlib.crc32(key) % self.partitions

    def append(self, p: int, m: Any) -> None:
        fencing = int(dict(m.headers).get(HEADER_FENCING, b"0"))
        self.log.setdefault(p, []).append(Appended(m.event_id, m.key, m.topic, fencing))

    def messages(self) -> list[Appended]:
        return [m for p in sorted(self.log) for m in self.log[p]]


@dataclass
class LeaseDoc:
    owner: str | None = None
    fencing: int = 0
    expires_at: float = 0.0
    token: dict[str, str] | None = None
    fingerprint: str | None = None
    stored: list[int] = field(default_factory=list)  # positions of every stored token, in order
    released: bool = False
    failing: Exception | None = None  # renewals and stores raise it (the server refuses writes)


class World:
    """Everything the fakes share; `violations` lists every broken guarantee seen."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random(0)
        self.clock = Clock()
        self.outbox = Outbox()
        self.broker = Broker()
        self.lease = LeaseDoc()
        self.violations: list[str] = []
        self.opens: list[StartPoint | str] = []  # "rescan" for a rescan
        self.stale_sent = 0  # messages sent with a stale fencing token since the last takeover
        self.max_events = 0  # RELAY_BATCH_MAX_EVENTS of the relay under test
        self.history_lost_before: int | None = None  # tokens covering fewer events left the oplog

    def violate(self, what: str) -> None:
        self.violations.append(what)

    def take_over(self, owner: str = "phantom", silent_s: float = 0.0) -> None:
        """Another replica takes the lease. With `silent_s` (the lease's TTL) it expired: the holder
        wrote nothing for that long (paused, or cut off from the server), so its clock moved on too.
        Without, it is fenced out while it runs (an operator's `checkpoint reset --force`)."""
        self.clock.advance(silent_s)
        self.lease.owner = owner
        self.lease.fencing += 1
        self.lease.expires_at = self.clock.now + 4.0
        self.stale_sent = 0


# ---- the boundaries ------------------------------------------------------------------------------

class FakeSource:
    """The change stream over `world.outbox`; each read returns a random number of what is there
    (as server batches and max_await timing would)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.position: int | None = None

    def open(self, start: StartPoint) -> None:
        w = self.world
        w.opens.append(start)
        if start.resume_after != w.lease.token:
            w.violate(f"opened at {start.resume_after} while the checkpoint is {w.lease.token}")
        if start.resume_after is not None:
            position = covered_by(start.resume_after)
            if w.history_lost_before is not None and position < w.history_lost_before:
                raise HistoryLostError("the stored checkpoint is no longer in the oplog (fake)")
            self.position = position
        elif start.at_time is not None and w.history_lost_before is not None:
            raise HistoryLostError("the start time is no longer in the oplog (fake)")
        else:
            self.position = len(w.outbox.changes) if start == StartPoint() else 0

    def rescan(self) -> None:
        """Open at "now", serve every outbox document as a batch without a token, then the
        opening token (RELAY_ON_HISTORY_LOST=rescan; relay.mongo.subscription.Subscription.rescan)."""
        w = self.world
        w.opens.append("rescan")
        self.position = len(w.outbox.changes)
        scan = f"00{len(w.opens):08x}"
        self.scan = deque(c._replace(position={"_data": f"{scan}{i:012x}"}, cluster_time=None, wall_ms=-1)
                          for i, c in enumerate(w.outbox.changes))

    @property
    def token(self) -> dict[str, str] | None:
        return None if self.position is None else token(self.position)

    def ready(self, timeout: float) -> bool:
        """The fake's reads never wait on a server."""
        return True

    def next_batch(self, max_events: int) -> Batch:
        assert self.position is not None, "open() first"
        if self.scan is not None:
            if not self.scan:
                self.scan = None
                return Batch([], token(self.position))  # the scan is done: the opening token covers it
            changes = [self.scan.popleft() for _ in range(min(max_events, len(self.scan)))]
            return Batch(changes, None)
        available = len(self.world.outbox.changes) - self.position
        n = self.world.rng.randint(0, min(max_events, available)) if available else 0
        if available and n == 0 and self.world.rng.random() < 0.7:
            n = min(max_events, available)  # mostly, what is there is returned
        changes = self.world.outbox.changes[self.position:self.position + n]
        self.position += n
        if not changes:
            self.world.clock.advance(AWAIT_S)  # a getMore with nothing new waits RELAY_MAX_AWAIT_MS
        return Batch(list(changes), token(self.position))

    def close(self) -> None:
        if self.position is not None:
            self.closed_at = None if self.scan is not None else self.position  # mid-scan: nothing covered
        self.position = None
        self.scan = None

    closed_at: int | None = None  # the position when the stream was last closed
    scan: deque[Change] | None = None  # the documents a rescan still has to serve


class _Report:
    """What librdkafka hands the delivery callback (only `value()` is read)."""

    def __init__(self, m: Any) -> None:
        self._value = m.value

    def value(self) -> bytes:
        return self._value


class FakePublisher:
    """relay.core.boundaries.Publisher over `world.broker`: reports come back in send order per
    partition, the partitions interleaved at random; `world.broker.fail_next` makes reports fail
    (the message may or may not have been appended: idempotence keeps no promise about a timed-out
    message). As librdkafka does, a partition whose message timed out sends nothing more until its
    requests in flight are drained; as the real publisher does, the first failed report makes the
    next poll drop everything still held (each dropped message reported as purged)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.pending: dict[int, deque[tuple[Any, Parcel]]] = {}
        self.draining: set[int] = set()
        self.failed: list[Parcel] = []
        self.closed = False

    def send(self, parcel: Parcel, while_waiting: Callable[[], None]) -> None:
        w = self.world
        parcel.failures = self.failed
        for m in parcel.messages:
            p = w.broker.partition(m.key)
            self.pending.setdefault(p, deque()).append((m, parcel))
            fencing = int(dict(m.headers)[HEADER_FENCING])
            if fencing == w.lease.fencing and w.clock.now >= w.lease.expires_at:
                w.violate(f"event {m.event_id} sent after its sender's lease expired (server time)")
            if fencing != w.lease.fencing:
                w.stale_sent += 1
                if w.stale_sent > w.max_events:
                    w.violate(f"{w.stale_sent} messages sent with a stale fencing token after a takeover")
        if self.queued > w.max_events:
            w.violate(f"{self.queued} messages unacknowledged, more than {w.max_events}")

    def poll(self, timeout: float) -> None:
        w, rng = self.world, self.world.rng
        busy = [p for p, q in self.pending.items() if q and p not in self.draining]
        for p in rng.sample(busy, rng.randint(1, len(busy))) if busy else []:
            queue = self.pending[p]
            for _ in range(rng.randint(1, len(queue))):
                m, parcel = queue.popleft()
                if (m.topic, m.event_id) in w.broker.refuse:
                    parcel.on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Report(m))
                    # The broker refuses the whole record batch: the rest of this partition's
                    # queue sent with it fails too.
                    while queue and queue[0][1] is parcel:
                        other, d = queue.popleft()
                        d.on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Report(other))
                    break
                if w.broker.fail_next:
                    w.broker.fail_next -= 1
                    if rng.random() < 0.5:
                        w.broker.append(p, m)  # written, but the report says it timed out
                    parcel.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), _Report(m))
                    self.draining.add(p)
                    break
                w.broker.append(p, m)
                w.broker.acked.add(m.event_id)
                parcel.on_delivery(None, _Report(m))
        if self.failed:
            self.failed.clear()
            self.purge()

    def drain(self, timeout: float) -> None:
        """A flush that may time out: the same random share of the reports as `poll`."""
        self.poll(timeout)

    def due_in(self) -> float | None:
        return None  # at-least-once: nothing held open

    def purge(self) -> None:
        """Drop what is held: each message is reported as purged, and none is written."""
        for queue in self.pending.values():
            while queue:
                m, parcel = queue.popleft()
                parcel.on_delivery(KafkaError(KafkaError._PURGE_QUEUE), _Report(m))
        self.draining.clear()

    def failure(self, parcel: Parcel) -> Exception:
        return parcel_failure(parcel)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.pending.values())

    def close(self) -> None:
        """Dropped: the oldest messages of a partition may already be on their way and still be
        appended, without a report (in order: idempotence never writes one without those before)."""
        for p, queue in self.pending.items():
            if p in self.draining:
                continue
            for m, _parcel in list(queue)[:self.world.rng.choice([0, 0, 1, 2])]:
                if (m.topic, m.event_id) in self.world.broker.refuse:
                    break
                self.world.broker.append(p, m)
        self.pending.clear()
        self.closed = True


class FakeLease:
    """The lease document in `world.lease`, fenced like relay.mongo.lease.LeaseStore (server time is
    the world's clock)."""

    lease_id = "db.outbox"

    def __init__(self, world: World, owner: str, ttl_s: float) -> None:
        self.world = world
        self.owner = owner
        self.ttl_s = ttl_s

    def try_acquire(self) -> Grant | None:
        d, now = self.world.lease, self.world.clock.now
        if d.owner not in (None, self.owner) and d.expires_at > now:
            return None
        if d.owner != self.owner:
            d.fencing += 1
            self.world.stale_sent = 0
        d.owner, d.expires_at, d.released = self.owner, now + self.ttl_s, False
        return Grant(self.owner, d.fencing, EPOCH, Checkpoint(d.token, None, d.fingerprint))

    def _fence(self, grant: Grant) -> None:
        d = self.world.lease
        if d.failing is not None:
            raise d.failing
        if (d.owner, d.fencing) != (grant.owner, grant.fencing_token):
            raise LeaseLostError(f"lease lost: fencing token {grant.fencing_token} of {grant.owner} is "
                                 f"no longer current")

    def renew(self, grant: Grant) -> None:
        self._fence(grant)
        self.world.lease.expires_at = self.world.clock.now + self.ttl_s

    def store_checkpoint(self, grant: Grant, tok: Any, fingerprint: str) -> None:
        self._fence(grant)
        w, d = self.world, self.world.lease
        position = covered_by(tok)
        missing = [c.event_id for c in w.outbox.changes[:position] if c.event_id not in w.broker.acked]
        if missing:
            w.violate(f"stored a token covering {position} events, {len(missing)} not acknowledged "
                      f"(first {missing[0]})")
        if d.stored and position < d.stored[-1]:
            w.violate(f"the checkpoint moved back from {d.stored[-1]} to {position}")
        d.token, d.fingerprint = dict(tok), fingerprint
        d.stored.append(position)
        d.expires_at = w.clock.now + self.ttl_s

    def release(self, grant: Grant) -> None:
        d = self.world.lease
        if (d.owner, d.fencing) == (grant.owner, grant.fencing_token):
            d.owner, d.expires_at, d.released = None, self.world.clock.now, True

class FakeAssignment:
    """A group's say over one relay (relay.core.boundaries.Assignment): `allow` gates lease attempts,
    `release` asks a leader to hand over at its next batch boundary (once). `held` follows what
    the relay reports, and `violations` what breaks the contract: a relay that reports holding
    a lease it was not allowed to try."""

    def __init__(self) -> None:
        self.allow = True
        self.release = False
        self.held = False
        self.handed_over = 0
        self.violations: list[str] = []
        self._asked = False

    def may_lead(self) -> bool:
        self._asked = self.allow
        return self.allow

    def led(self, held: bool) -> None:
        if held and not self.held and not self._asked:
            self.violations.append("took the lease without asking may_lead()")
        self.held = held

    def hand_over(self) -> bool:
        if self.release:
            self.release = False
            self.handed_over += 1
            return True
        return False


class FakeDeliveryMode:
    """At-least-once mode (relay.core.boundaries.DeliveryMode): a new FakePublisher per leading
    session, and no offsets topic (nothing ever ran exactly-once here)."""

    name = "at-least-once"
    offsets_topic = "outbox-relay.offsets"

    def __init__(self, world: World) -> None:
        self.world = world
        self.publishers: list[Any] = []

    def start(self, grant: Grant, heartbeat: Callable[[], None]) -> Any:
        self.publishers.append(FakePublisher(self.world))
        return self.publishers[-1]

    def committed_record(self, heartbeat: Callable[[], None]) -> None:
        return None

    def forget(self, publisher: Any, heartbeat: Callable[[], None]) -> None:
        raise AssertionError("an at-least-once relay forgets no offsets record")


# ---- a relay on the fakes ------------------------------------------------------------------------

def fake_settings(**changes: Any) -> Settings:
    base = Settings().replace(instance_id="A", lease_ttl_s=4.0, heartbeat_interval_s=1.0, standby_poll_s=0.5,
                              restart_backoff_max_s=2.0, http_port=0, batch_max_events=10, checkpoint_interval_ms=0)
    return base.replace(**changes)


@dataclass
class FakeRelay:
    relay: Relay
    publishers: list[FakePublisher]
    sources: list[FakeSource]


def relay_on(world: World, settings: Settings, producers: Any, source: Callable[[], FakeSource],
             lease: FakeLease, observer: ScopeObserver | None = None, assignment: FakeAssignment | None = None,
             coalescer: Coalescer | None = None) -> Relay:
    """A real `Relay` with the real MessageBuilder, its boundaries the world's fakes; its checkpoints
    go through `coalescer` (the process's, shared with other loops), else its own (a process of one
    loop) at RELAY_CHECKPOINT_INTERVAL_MS."""
    world.max_events = settings.batch_max_events
    parts = settings.parts()
    if coalescer is None:
        coalescer = Coalescer(
            LeaseByLease(lease), settings.checkpoint_interval_ms / 1000, world.clock, settings.checkpoint_max_events
        )
    return Relay(parts.loop, source=source, mode=producers, lease=lease,
                 encoder=message_builder(parts, FOLDER), observer=observer or loop_observer(settings),
                 fingerprint=FINGERPRINT, clock=world.clock, coalescer=coalescer,
                 **({} if assignment is None else {"assignment": assignment}))


def loop_observer(settings: Settings) -> ScopeObserver:
    """The observer of a relay loop on the whole outbox, as the wiring makes it (one partition)."""
    parts = settings.parts()
    return ProcessObserver(parts.observer, parts.outboxes).loop(Scope(parts.outboxes[0]))


def fake_relay(world: World, settings: Settings, observer: ScopeObserver | None = None,
               assignment: FakeAssignment | None = None) -> FakeRelay:
    """A real `Relay` (and the real MessageBuilder) on the world's fakes, at-least-once."""
    producers = FakeDeliveryMode(world)
    sources: list[FakeSource] = []

    def new_source() -> FakeSource:
        sources.append(FakeSource(world))
        return sources[-1]

    relay = relay_on(world, settings, producers, new_source, FakeLease(world, settings.instance_id, settings.lease_ttl_s),
                     observer, assignment)
    return FakeRelay(relay, producers.publishers, sources)


class MemoryCheckpointStore:
    """relay.core.boundaries.CheckpointStore in memory, over several lease documents (`leases`: lease id
    -> [owner, fencing token, stored token]): each position stored only while its grant's owner and
    fencing token are current, the others stored by the same write. `writes` lists the lease ids
    of every write; `fail_next` makes the next writes raise, storing nothing."""

    def __init__(self, *lease_ids: str, owner: str = "me") -> None:
        self.leases: dict[str, list[Any]] = {lid: [owner, 1, None] for lid in lease_ids}
        self.writes: list[list[str]] = []
        self.fail_next = 0

    def grant(self, lease_id: str) -> Grant:
        owner, fencing, tok = self.leases[lease_id]
        return Grant(owner, fencing, EPOCH, Checkpoint(tok, None, FINGERPRINT))

    def take_over(self, lease_id: str) -> None:
        self.leases[lease_id][0] = "phantom"
        self.leases[lease_id][1] += 1

    def stored(self, lease_id: str) -> Any:
        return self.leases[lease_id][2]

    def store(self, checkpoints: Any) -> set[str]:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("the server did not answer (fake)")
        refused = set()
        for p in checkpoints:
            doc = self.leases[p.lease_id]
            if (doc[0], doc[1]) != (p.grant.owner, p.grant.fencing_token):
                refused.add(p.lease_id)
            else:
                doc[2] = p.token
        self.writes.append([p.lease_id for p in checkpoints])
        return refused

"""Writing events as an application does: several threads committing to an outbox in
transactions (`write_events`, `background_writes`), and what they committed, in commit order per
aggregate (`Written`), for the oracle."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pymongo.database import Database

from relay.outbox import Outbox, OutboxEvent


@dataclass
class Written:
    """What the writers committed: event ids in commit order per aggregate."""

    per_aggregate: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    ids: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, events: Iterable[OutboxEvent]) -> None:
        with self.lock:
            for e in events:
                self.per_aggregate[e.aggregate_id].append(e.id_str)
                self.ids.add(e.id_str)

    def add_from(self, other: Written) -> None:
        """What `other` committed, after what this one did (it was written later)."""
        with self.lock:
            for aggregate, ids in other.per_aggregate.items():
                self.per_aggregate[aggregate].extend(ids)
            self.ids |= other.ids


def write_events(db: Database[Any], collection: str, total: int, writers: int = 4, max_per_txn: int = 4,
                 aggregates_per_writer: int = 40, seed: int = 1, aggregate_type: str = "order",
                 written: Written | None = None, pause: Callable[[], None] | None = None,
                 until: threading.Event | None = None) -> Written:
    """`writers` threads commit `total` events in transactions of 1..max_per_txn events; with
    `until`, each goes on past its share until the event is set (a fault test sets it once its
    last fault landed, so every fault lands while the writers are busy, however slow the machine).

    Each writer owns its aggregates, so per-aggregate commit order is the writer's order; the
    payload carries a per-aggregate sequence number `seq` starting at 1.
    """
    written = written or Written()
    outbox = Outbox(db[collection])
    per_writer = [total // writers + (1 if i < total % writers else 0) for i in range(writers)]

    def writer(index: int, count: int) -> None:
        rng = random.Random(seed * 1000 + index)
        seq: dict[str, int] = defaultdict(int)
        done = 0
        with db.client.start_session() as session:
            while done < count or (until is not None and not until.is_set()):
                n = rng.randint(1, max_per_txn) if done >= count else min(rng.randint(1, max_per_txn), count - done)
                events = []
                for _ in range(n):
                    agg = f"w{index}-a{rng.randrange(aggregates_per_writer)}"
                    seq[agg] += 1
                    events.append(OutboxEvent.new(aggregate_type, agg, "Changed",
                                                  {"seq": seq[agg], "writer": index, "note": "x" * rng.randint(0, 64)}))
                session.with_transaction(lambda s: outbox.add_many(events, session=s))
                written.add(events)
                done += n
                if pause is not None:
                    pause()

    # Daemon threads: a failed test must not keep the suite alive while its writers retry
    # (with_transaction retries for up to 120 s against a stopped server).
    threads = [threading.Thread(target=writer, args=(i, c), daemon=True) for i, c in enumerate(per_writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return written


def background_writes(env: Any, written: Written, total: int, writers: int = 2, pause: float = 0.01,
                      max_per_txn: int = 4, until: threading.Event | None = None) -> threading.Thread:
    """Start writers committing `total` events in transactions, paced by `pause` per transaction
    (with `until`: at least `total`, until it is set; see `write_events`)."""
    thread = threading.Thread(target=write_events, kwargs=dict(
        db=env.db, collection=env.settings.outbox_collection, total=total, writers=writers,
        max_per_txn=max_per_txn, written=written, pause=lambda: time.sleep(pause), until=until), daemon=True)
    thread.start()
    return thread

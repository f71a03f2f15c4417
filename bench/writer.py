"""The steady-state load generator: a child process inserting outbox events on a fixed schedule.

The writer runs in its own process (like a real service), so its commit times are not
delayed by the relay holding the benchmark process's GIL: with writer threads next to the
relay, `time.time()` after `insert_one` was seen up to ~12 ms late (negative latencies).

The child is `python -m bench.writer ARGUMENTS` (JSON), started through the reaper
(relay.dev.processes.spawn: it dies with the benchmark however that ends); parent and child
speak JSON lines over its stdin and stdout: "ready", "go", then the results (or "error: ...").
"""

from __future__ import annotations

import itertools
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from pymongo import MongoClient
from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from bench.events import EventFactory
from harness import ROOT
from relay.dev.processes import spawn
from relay.outbox import Outbox, OutboxEvent

# Threads sharing one schedule. An insert_one with majority write concern takes 2-50 ms on two
# busy cores: with 4 threads the writer fell behind at 1,000/s (415/s reached), so 16 for insert_one.
WRITER_THREADS = 16
BATCH_WRITER_THREADS = 4   # insert_many every 10 ms: a few threads keep 10,000/s


class OutboxesInTurn(Outbox):
    """Several outboxes written in turn: each `add_many` goes to the next one, as the services of
    several outboxes would write at once (bench.scenarios.outboxes)."""

    def __init__(self, collections: Sequence[Collection[Any]]) -> None:
        super().__init__(collections[0])
        self._outboxes = [Outbox(c) for c in collections]
        self._turn = itertools.count()

    def add_many(self, events: Iterable[OutboxEvent], session: ClientSession | None = None) -> list[Any]:
        return self._outboxes[next(self._turn) % len(self._outboxes)].add_many(events, session=session)

    def init(self, ttl_seconds: int | None = None) -> list[str]:
        return [name for outbox in self._outboxes for name in outbox.init(ttl_seconds)]


class RateWriter:
    """Inserts outbox events on a fixed schedule; records when each write returned.

    Event i is due at start + i / rate. Writes are `batch` events at a time, sent when the first
    of them is due, each event with its business document (`business`, an `orders` collection)
    in one transaction, as a service writes them (10,000/s as one `insert_one` per event cannot be sustained by a Python
    client on these two cores; 100 events every 10 ms can). A few threads share the
    schedule (each takes the next due write), so one slow write does not hold up the next.
    """

    def __init__(self, outbox: Outbox, factory: EventFactory, rate_per_s: float, seconds: float,
                 batch: int = 1, threads: int | None = None, business: Collection[Any] | None = None) -> None:
        self.outbox, self.factory, self.business = outbox, factory, business
        self.rate, self.total, self.batch = rate_per_s, int(rate_per_s * seconds), max(1, batch)
        self.committed: dict[str, float] = {}   # event id -> time.time() after its write returned
        self.round_trips: list[float] = []      # seconds each write took (commit-time uncertainty)
        self.max_behind_s = 0.0
        self.behind: list[float] = []           # seconds each write started after it was due
        self.seconds = 0.0
        self.errors: list[BaseException] = []
        self._threads = threads or (WRITER_THREADS if self.batch == 1 else BATCH_WRITER_THREADS)
        self._next = 0
        self._lock = threading.Lock()
        self._started = 0.0

    def _take(self) -> range | None:
        with self._lock:
            if self._next >= self.total or self.errors:
                return None
            first = self._next
            self._next = min(self.total, first + self.batch)
            return range(first, self._next)

    def _work(self) -> None:
        try:
            while (seqs := self._take()) is not None:
                ahead = self._started + seqs[0] / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                else:
                    self.max_behind_s = max(self.max_behind_s, -ahead)
                self.behind.append(max(0.0, -ahead))
                events = [self.factory.event(i) for i in seqs]
                sent = time.time()
                self._commit(events)
                returned = time.time()
                for event in events:
                    self.committed[event.id_str] = returned
                self.round_trips.append(returned - sent)
        except BaseException as exc:  # noqa: BLE001 - re-raised by run()
            self.errors.append(exc)

    def _commit(self, events: list[OutboxEvent]) -> None:
        """What a service does: its business documents and their outbox events in one
        transaction (pymongo's `with_transaction` retries it on transient errors); without a
        `business` collection, just the events."""
        if self.business is None:
            self.outbox.add_many(events)
            return
        business = self.business
        orders = [{"_id": e.aggregate_id + "/" + e.id_str, "aggregateId": e.aggregate_id, "state": e.event_type}
                  for e in events]

        def write(session: ClientSession) -> None:
            business.insert_many(orders, session=session)
            self.outbox.add_many(events, session=session)

        with business.database.client.start_session() as session:
            session.with_transaction(write)

    def run(self) -> None:
        """Write every event (blocks); raises the first writer error."""
        self._started = time.monotonic()
        workers = [threading.Thread(target=self._work, name=f"bench-writer-{n}", daemon=True)
                   for n in range(self._threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        self.seconds = time.monotonic() - self._started
        if self.errors:
            raise RuntimeError(f"writer failed: {self.errors[0]!r}") from self.errors[0]


def writer_process(uri: str, database: str, rate_per_s: float, seconds: float, payload_bytes: int,
                   batch: int, conn: Any, collections: Sequence[str] = ("outbox",)) -> None:
    """Child-process entry: connect, say "ready", wait for "go", write, send the results. With
    several `collections`, the writes go to those outboxes in turn (OutboxesInTurn)."""
    try:
        with MongoClient(uri) as client:
            db = client[database]
            client.admin.command("ping")
            outbox = Outbox(db[collections[0]]) if len(collections) == 1 else OutboxesInTurn([db[c] for c in collections])
            writer = RateWriter(outbox, EventFactory(payload_bytes), rate_per_s, seconds, batch=batch,
                                business=db["orders"])
            conn.send("ready")
            if conn.recv() != "go":
                return
            writer.run()
            conn.send({"committed": writer.committed, "seconds": writer.seconds,
                       "max_behind_s": writer.max_behind_s, "round_trips": writer.round_trips,
                       "behind": writer.behind})
    except EOFError:
        return  # the parent closed our stdin before "go": nothing to write
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(f"error: {exc!r}")


class Lines:
    """One end of the writer's conversation: JSON messages, a line each, sent on `out` and read
    from `into` (by a thread of its own, so `poll` can wait with a timeout)."""

    def __init__(self, into: IO[bytes], out: IO[bytes]) -> None:
        self._out = out
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._next: bytes | None = None
        self._ended = False
        threading.Thread(target=self._read, args=(into,), name="bench-writer-lines", daemon=True).start()

    def _read(self, into: IO[bytes]) -> None:
        for line in into:
            self._lines.put(line)
        self._lines.put(b"")  # end of file

    def send(self, message: Any) -> None:
        self._out.write(json.dumps(message).encode() + b"\n")
        self._out.flush()

    def poll(self, timeout_s: float | None) -> bool:
        """Whether a message (or the end of the file) arrived within `timeout_s`."""
        if self._next is None:
            try:
                self._next = self._lines.get(timeout=timeout_s)
            except queue.Empty:
                return False
        return True

    def recv(self) -> Any:
        """The next message; EOFError once the other end closed."""
        self.poll(None)
        line, self._next = self._next, None
        if not line:
            self._ended = True
            raise EOFError
        return json.loads(line)

    def until_closed(self) -> None:
        """Wait for the other end to close, so that the reading thread has ended before this
        process does (a daemon thread blocked reading stdin aborts the interpreter's exit:
        "Fatal Python error: _enter_buffered_busy")."""
        while not self._ended:
            try:
                self.recv()
            except EOFError:
                return


@contextmanager
def writer_child(uri: str, database: str, rate_per_s: float, seconds: float, payload_bytes: int,
                 batch: int, collections: tuple[str, ...] = ("outbox",)) -> Iterator[Lines]:
    """Start `writer_process` in a child process (through the reaper) and yield the parent's end
    of the conversation."""
    arguments = json.dumps([uri, database, rate_per_s, seconds, payload_bytes, batch, list(collections)])
    child = spawn([sys.executable, "-m", "bench.writer", arguments], cwd=ROOT, stdin=subprocess.PIPE,
                  stdout=subprocess.PIPE)
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        yield Lines(child.stdout, child.stdin)
    finally:
        child.stdin.close()  # a child still waiting for "go" reads the end of the file and exits
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:  # our own child, by its pid
            child.terminate()
            child.wait(timeout=10)


def receive(conn: Any, timeout_s: float, what: str) -> Any:
    """The writer's next message; raises if it failed, exited or said nothing in time."""
    if not conn.poll(timeout_s):
        raise TimeoutError(f"writer process: no {what} after {timeout_s:.0f}s")
    try:
        message = conn.recv()
    except EOFError:
        raise RuntimeError(f"writer process exited before sending its {what}") from None
    if isinstance(message, str) and message.startswith("error:"):
        raise RuntimeError(f"writer process failed: {message[6:].strip()}")
    return message


def main(argv: list[str]) -> None:
    """`python -m bench.writer ARGUMENTS`: the child `writer_child` starts."""
    uri, database, rate_per_s, seconds, payload_bytes, batch, collections = json.loads(argv[0])
    lines = Lines(sys.stdin.buffer, sys.stdout.buffer)
    writer_process(uri, database, rate_per_s, seconds, payload_bytes, batch, lines, collections)
    lines.until_closed()  # the parent closes our stdin when it is done with us (writer_child)


if __name__ == "__main__":
    main(sys.argv[1:])

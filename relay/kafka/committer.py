"""The commit thread of exactly-once mode: `commit_transaction` on a thread of its own, while the
loop's thread reads and encodes on (relay.kafka.transactions).

A commit is a fixed wait of ~18 ms (the last messages' round trip, EndTxn, the markers:
docs/exactly-once.md#cost). `Committer.start` hands it to a one-thread executor: the call is
retried while librdkafka answers "still flushing" (a retriable error that needs no abort) until
the delivery timeout ends it or `close` stops it; then `flush` serves any report still due (none
after a commit: commit_transaction flushes; a safety net, bounded). The loop's thread learns the
outcome from the commit's Future, by `take`.

Who owns what: this object is all that the loop's thread and the commit thread both touch, each
field with its rule:
- the producer: the commit thread's alone from `start` until `take`, the loop's otherwise (the
  loop calls nothing of it while `busy`: relay.kafka.transactions);
- `_commit`, the commit's Future: set and cleared on the loop's thread only (`start`, `take`); the
  commit thread only completes it, and the Future hands its outcome over (with everything the
  commit thread did before it);
- `_closing`, a threading.Event: set on the loop's thread (`close`), read by the commit thread
  between attempts (it stops retrying).
The commit thread writes nothing else. The delivery reports that commit_transaction serves run on
it: they count the committing parcels' reports (relay.core.window.Parcel.on_delivery), which the
loop only reads meanwhile (held until their transaction ends, they are not done) and releases once
`take` returned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from typing import Protocol

from relay.core.config import WAIT_SLICE_S
from relay.core.retry import retrying
from relay.kafka.errors import kafka_error


class TransactionCalls(Protocol):
    """What the committer calls of the producer (confluent_kafka.Producer)."""

    def commit_transaction(self, timeout: float) -> None: ...

    def flush(self, timeout: float) -> int: ...


def still_working(abortable: bool) -> Callable[[BaseException], bool]:
    """Whether a transaction call's error says "not done yet, call again": retriable, not fatal,
    and (for a commit) not one that needs the transaction aborted."""

    def retriable(exc: BaseException) -> bool:
        err = kafka_error(exc)
        if err is None or not err.retriable() or err.fatal():
            return False
        return abortable or not err.txn_requires_abort()

    return retriable


class Committer:
    """Commits the producer's transaction on the commit thread, one at a time (see the module
    docstring). `report_wait_s` bounds the wait for reports after a commit (the safety net)."""

    def __init__(self, producer: TransactionCalls, report_wait_s: float) -> None:
        self._producer = producer
        self._report_wait_s = report_wait_s
        self._commit: Future[None] | None = None
        self._closing = threading.Event()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kafka-commit")

    @property
    def busy(self) -> bool:
        """A commit was started and its outcome not taken yet: the producer is the commit thread's."""
        return self._commit is not None

    @property
    def ended(self) -> bool:
        """The commit in flight ended: `take` returns (or raises) at once."""
        return self._commit is not None and self._commit.done()

    def start(self) -> None:
        """Hand the open transaction's commit to the commit thread (the loop's thread produced
        everything it holds, the offsets record last, and calls the producer no more until `take`)."""
        assert self._commit is None, "one commit at a time"
        self._commit = self._thread.submit(self._run)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` for the commit in flight to end; whether it did (or none is)."""
        if self._commit is not None:
            wait_for([self._commit], timeout)
        return self._commit is None or self._commit.done()

    def take(self) -> None:
        """The commit ended: return if the transaction committed (every report served), else raise
        its error (a KafkaException: fenced, fatal, abortable, or retried until a stop). The
        producer is the loop's again either way."""
        commit, self._commit = self._commit, None
        assert commit is not None, "a commit was started"
        assert commit.done(), "the commit has ended"
        commit.result()

    def close(self, timeout: float) -> bool:
        """Stop the commit in flight from retrying, wait up to `timeout` for it, and let the thread
        end once it is idle. Whether no commit runs any more (the producer is the loop's again,
        the commit's outcome left to `take`)."""
        self._closing.set()
        ended = self.wait(timeout)
        self._thread.shutdown(wait=False)
        return ended

    def _run(self) -> None:
        """On the commit thread: commit (each attempt waits at most a slice), then serve any report
        still due."""
        retrying(still_working(abortable=False), until=self._closing.is_set)(
            self._producer.commit_transaction, WAIT_SLICE_S
        )
        self._producer.flush(self._report_wait_s)

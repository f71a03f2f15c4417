"""Exactly-once mode's commit thread and the loop's bookkeeping beside it, fast: the committer
(relay.kafka.committer) alone, on a scripted producer that answers its two calls; the open
transaction and the parcels waiting for its commit (relay.kafka.open_transaction). The whole
publisher runs against a real broker: tests/integration/test_exactly_once.py and
tests/faults/test_exactly_once_faults.py. Nothing here asserts a duration: the commit thread is
held by gates, and every wait has a generous timeout that only a hang reaches."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from relay.core.message import OutgoingMessage
from relay.core.window import Parcel
from relay.kafka.committer import Committer
from relay.kafka.open_transaction import OpenTransaction, WaitingParcels

HANG_S = 10.0  # only a hang waits this long

STILL_FLUSHING = KafkaError(KafkaError.REQUEST_TIMED_OUT, "still flushing", retriable=True)
NEEDS_ABORT = KafkaError(KafkaError.INVALID_TXN_STATE, "abortable", retriable=True, txn_requires_abort=True)


class ScriptedProducer:
    """The producer calls a committer makes (relay.kafka.committer.TransactionCalls): each
    `commit_transaction` attempt first waits for `gate` (when given), then takes the next
    outcome (None: committed; a KafkaError: raised), the last one again once they run out. Every
    call records the thread it ran on."""

    def __init__(self, *outcomes: KafkaError | None, gate: threading.Event | None = None) -> None:
        self.outcomes = list(outcomes) or [None]
        self.gate = gate
        self.attempt = threading.Event()  # set at every attempt's start
        self.calls: list[tuple[str, str]] = []  # (call, thread name)

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append(("commit_transaction", threading.current_thread().name))
        self.attempt.set()
        if self.gate is not None:
            assert self.gate.wait(HANG_S), "the gate was never opened"
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if outcome is not None:
            raise KafkaException(outcome)

    def flush(self, timeout: float) -> int:
        self.calls.append(("flush", threading.current_thread().name))
        return 0

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _started(*outcomes: KafkaError | None, gate: threading.Event | None = None) -> tuple[Committer, ScriptedProducer]:
    """A committer on a scripted producer, its commit started."""
    producer = ScriptedProducer(*outcomes, gate=gate)
    committer = Committer(producer, report_wait_s=1.0)
    committer.start()
    return committer, producer


def _ended(committer: Committer) -> None:
    assert committer.wait(HANG_S), "the commit never ended"


def test_a_commit_runs_on_the_commit_thread_and_the_loop_takes_its_outcome_once_it_ended():
    gate = threading.Event()
    committer, producer = _started(None, gate=gate)
    assert producer.attempt.wait(HANG_S)
    assert committer.busy and not committer.ended, "in flight: the producer is the commit thread's"
    assert not committer.wait(0), "a wait that ends first says so"
    gate.set()
    _ended(committer)
    assert committer.busy, "ended, but the producer is the commit thread's until the loop takes the outcome"
    committer.take()
    assert not committer.busy
    assert producer.names() == ["commit_transaction", "flush"], "commit, then serve any report still due"
    assert all(thread.startswith("kafka-commit") for _, thread in producer.calls), producer.calls
    committer.close(HANG_S)


def test_a_commit_still_flushing_is_retried_until_it_commits():
    committer, producer = _started(STILL_FLUSHING, STILL_FLUSHING, None)
    _ended(committer)
    committer.take()
    assert producer.names() == ["commit_transaction"] * 3 + ["flush"]
    committer.close(HANG_S)


def test_a_commit_that_needs_an_abort_is_not_retried_and_the_loop_gets_its_error():
    committer, producer = _started(NEEDS_ABORT)
    _ended(committer)
    with pytest.raises(KafkaException) as raised:
        committer.take()
    assert raised.value.args[0].code() == KafkaError.INVALID_TXN_STATE
    assert producer.names() == ["commit_transaction"], "no retry, no flush: the loop aborts it"
    assert not committer.busy, "the producer is the loop's again, to abort"
    committer.close(HANG_S)


def test_close_stops_a_commit_that_keeps_retrying_and_leaves_its_error_to_take():
    committer, producer = _started(STILL_FLUSHING)  # never done
    assert producer.attempt.wait(HANG_S)
    assert committer.close(HANG_S), "the retries stop at close"
    with pytest.raises(KafkaException):
        committer.take()
    assert "flush" not in producer.names()


def test_close_bounds_its_wait_for_a_commit_that_does_not_return():
    gate = threading.Event()
    committer, producer = _started(None, gate=gate)
    assert producer.attempt.wait(HANG_S)
    assert not committer.close(0.0), "still running: close says so instead of waiting on"
    assert committer.busy, "the producer stays the commit thread's"
    gate.set()
    _ended(committer)
    committer.take()


def test_one_commit_at_a_time():
    gate = threading.Event()
    committer, _ = _started(None, gate=gate)
    with pytest.raises(AssertionError, match="one commit at a time"):
        committer.start()
    gate.set()
    _ended(committer)
    committer.take()
    committer.close(HANG_S)


# ---- the loop's bookkeeping -------------------------------------------------------------------------


def _parcel(events: int, value: bytes = b"x" * 10, token: dict[str, str] | None = None, topic: str = "t") -> Parcel:
    messages = [OutgoingMessage(f"e{i}", topic, b"k", value, []) for i in range(events)]
    return Parcel([-1] * events, messages, token, sent_at=0.0)


def test_the_open_transaction_is_full_at_its_event_or_byte_bound_and_due_from_its_begin():
    txn = OpenTransaction()
    assert txn.due_in(0.1, now=5.0) is None, "no parcel: nothing is due"
    txn.begin(at=5.0)
    txn.add(_parcel(3, token={"_data": "01"}, topic="b"))
    txn.add(_parcel(2, token=None, topic="a"))  # rescanned documents: no token of their own
    assert txn.begun and (txn.events, txn.bytes) == (5, 50)
    assert not txn.full(max_events=6, max_bytes=51)
    assert txn.full(max_events=5, max_bytes=1000) and txn.full(max_events=1000, max_bytes=50)
    assert txn.due_in(0.1, now=5.04) == pytest.approx(0.06)
    assert txn.newest_token() == {"_data": "01"}, "the offsets record carries the newest token there is"
    assert txn.topics() == ["a", "b"]


def test_parcels_waiting_for_a_commit_wait_since_the_first_hand_over():
    waiting = WaitingParcels()
    assert waiting.due_in(0.1, now=1.0) == 0.1, "none waits: the whole bound"
    first, second = _parcel(1), _parcel(1)
    waiting.add(first, now=1.0)
    waiting.add(second, now=1.05)
    assert waiting.due_in(0.1, now=1.07) == pytest.approx(0.03), "counted from the first hand-over"
    assert waiting.pop() is first
    assert waiting.since == 1.0, "the others waited that long too"
    assert waiting.take_all() == [second] and len(waiting) == 0
    waiting.add(first, now=2.0)
    assert waiting.since == 2.0

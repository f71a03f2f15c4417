"""The JetStream publisher's rules (relay.nats.publisher), fast: the real publisher and sender on a
real event loop thread, over an in-memory JetStream whose PubAcks the test answers.

Rules checked: messages go out in send order; a parcel is acknowledged only once every PubAck came
back (a duplicate counts); the first failure stops everything after it (nothing more sent, the
connection closed); a parcel whose publish_by passed is not sent; a missing PubAck fails it after
the timeout; what NATS cannot carry is a poison event naming it, the messages before it sent; each
failure becomes the relay error its kind says.
"""

from __future__ import annotations

import asyncio
import queue
import time
from typing import Any

import pytest
from nats.js.api import PubAck
from nats.js.errors import APIError

from relay.core.errors import DeliveryError, LeaseUnrenewedError, PoisonEventError, ServerRefusedError
from relay.core.message import OutgoingMessage
from relay.core.window import Parcel
from relay.loop_thread import EventLoopThread
from relay.nats.publisher import JetStreamPublisher, Sender
from tests.support.waiting import wait_until


class FakeJetStream:
    """publish_async records each message and returns a future the test resolves (`ack`, `fail`)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []
        self.acks: list[asyncio.Future[Any]] = []

    async def publish_async(
        self, subject: str, payload: bytes, headers: dict[str, str], wait_stall: float | None = None
    ) -> asyncio.Future[Any]:
        self.sent.append((subject, payload, headers))
        self.acks.append(asyncio.get_running_loop().create_future())
        return self.acks[-1]


class FakeConnection:
    def __init__(self) -> None:
        self.js = FakeJetStream()
        self.is_closed = False

    def jetstream(self) -> FakeJetStream:
        return self.js

    async def close(self) -> None:
        self.is_closed = True


class World:
    def __init__(self, ack_timeout_s: float = 30.0, max_payload: int = 1 << 20) -> None:
        self.thread = EventLoopThread("test-nats")
        self.connection = FakeConnection()
        reports: queue.SimpleQueue[Any] = queue.SimpleQueue()

        async def sender() -> Sender:
            s = Sender(reports, ack_timeout_s)
            s.start(self.connection)  # type: ignore[arg-type]
            return s

        self.sender = self.thread.run(sender(), 5)
        self.stream_of: Any = lambda subject: "S"
        self.publisher = JetStreamPublisher(self.thread, self.sender, reports, max_payload, lambda s: self.stream_of(s))

    @property
    def js(self) -> FakeJetStream:
        return self.connection.js

    def answer(self, index: int, result: Any) -> None:
        future = self.js.acks[index]

        def resolve() -> None:
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.thread.call(resolve)

    def ack(self, *indexes: int, duplicate: bool = False) -> None:
        for i in indexes:
            self.answer(i, PubAck(stream="S", seq=i + 1, duplicate=duplicate or None))

    def sent_count(self, n: int) -> None:
        wait_until(lambda: len(self.js.sent) >= n, 5, f"{n} messages sent", interval=0.01)

    def settle(self, parcel: Parcel) -> None:
        deadline = time.monotonic() + 5
        while not parcel.done and time.monotonic() < deadline:
            self.publisher.poll(0.05)
        assert parcel.done, "the parcel was reported"

    def close(self) -> None:
        self.publisher.close()
        self.thread.close()


@pytest.fixture
def world():
    w = World()
    yield w
    w.close()


def _message(i: int, **changes: Any) -> OutgoingMessage:
    m = OutgoingMessage(
        f"e{i}",
        "outbox.event.order",
        f"a{i % 3}".encode(),
        f"value-{i}".encode(),
        [("ce_id", f"e{i}".encode()), ("relay_fencing_token", b"1")],
    )
    for k, v in changes.items():
        setattr(m, k, v)
    return m


def _parcel(first: int, n: int, publish_by: float | None = None, **changes: Any) -> Parcel:
    messages = [_message(i, **changes) for i in range(first, first + n)]
    return Parcel([0] * n, messages, {"_data": f"{first + n:04d}"}, time.monotonic(), publish_by=publish_by)


def test_messages_go_out_in_send_order_with_the_msg_id_and_the_aggregate_id(world):
    parcels = [_parcel(0, 3), _parcel(3, 2), _parcel(5, 4)]
    for p in parcels:
        world.publisher.send(p, lambda: None)
    world.sent_count(9)
    assert [h["Nats-Msg-Id"] for _, _, h in world.js.sent] == [f"e{i}" for i in range(9)]
    assert [d for _, d, _ in world.js.sent] == [f"value-{i}".encode() for i in range(9)]
    assert world.js.sent[4][2]["relay_aggregate_id"] == "a1" and world.js.sent[4][2]["ce_id"] == "e4"
    assert world.publisher.queued == 9


def test_a_parcel_is_acknowledged_only_once_every_puback_came_back_a_duplicate_counting(world):
    parcel = _parcel(0, 3)
    world.publisher.send(parcel, lambda: None)
    world.sent_count(3)
    world.ack(0, 2)
    world.publisher.poll(0.2)
    assert not parcel.done, "one PubAck still missing"
    world.ack(1, duplicate=True)
    world.settle(parcel)
    assert parcel.acknowledged and world.publisher.queued == 0


def test_the_first_failure_stops_everything_after_it(world):
    first, second = _parcel(0, 2), _parcel(2, 2)
    world.publisher.send(first, lambda: None)
    world.publisher.send(second, lambda: None)
    world.sent_count(4)
    world.ack(0, 2, 3)
    world.answer(1, APIError(code=503, err_code=10008, description="JetStream system temporarily unavailable"))
    world.settle(first)
    world.settle(second)
    assert first.failure is not None and first.failed_event_id() == "e1"
    assert isinstance(world.publisher.failure(first), DeliveryError)
    third = _parcel(4, 2)
    world.publisher.send(third, lambda: None)
    assert third.done and third.failure is not None, "refused at once, unsent"
    time.sleep(0.1)
    assert len(world.js.sent) == 4 and world.connection.is_closed, "nothing more on the wire; the connection closed"


def test_parcels_handed_over_before_a_failure_was_seen_are_not_sent_after_it(world):
    first = _parcel(0, 1)
    world.publisher.send(first, lambda: None)
    world.sent_count(1)
    world.answer(0, APIError(code=500, err_code=10077, description="maximum messages exceeded"))
    wait_until(lambda: world.connection.is_closed, 5, "the sender to stop", interval=0.01)
    second = _parcel(1, 2)
    world.publisher.send(second, lambda: None)  # the loop has not taken the failure yet
    world.settle(first)
    world.settle(second)
    assert len(world.js.sent) == 1 and second.failure is not None
    assert isinstance(world.publisher.failure(first), ServerRefusedError)
    assert "maximum messages exceeded" in str(world.publisher.failure(first))


def test_a_parcel_whose_publish_by_passed_is_not_put_on_the_wire(world):
    late = _parcel(0, 3, publish_by=time.monotonic() - 0.001)
    world.publisher.send(late, lambda: None)
    world.settle(late)
    assert world.js.sent == [] and isinstance(world.publisher.failure(late), LeaseUnrenewedError)


def test_a_missing_puback_fails_the_parcel_after_the_timeout():
    w = World(ack_timeout_s=0.2)
    try:
        parcel = _parcel(0, 2)
        w.publisher.send(parcel, lambda: None)
        w.sent_count(2)
        w.ack(0)
        w.settle(parcel)
        error = w.publisher.failure(parcel)
        assert isinstance(error, DeliveryError) and "e1" in str(error) and "within 0.2 s" in str(error)
    finally:
        w.close()


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"headers": [("ce_id", b"e1"), ("note", b"two\r\nNats-Msg-Id: x")]}, "line break"),
        ({"headers": [("ce_id", b"e1"), ("bad name", b"x")]}, "header name"),
        ({"topic": "outbox..order"}, "not one NATS accepts"),
        ({"value": b"x" * 2000}, "max_payload"),
    ],
)
def test_what_nats_cannot_carry_is_a_poison_event_the_messages_before_it_sent(change, reason):
    w = World(max_payload=1500)
    try:
        messages = [_message(0), _message(1, **change), _message(2)]
        parcel = Parcel([0] * 3, messages, {"_data": "0003"}, time.monotonic())
        w.publisher.send(parcel, lambda: None)
        w.sent_count(1)
        w.ack(0)
        w.settle(parcel)
        error = w.publisher.failure(parcel)
        assert isinstance(error, PoisonEventError) and error.event_id == "e1" and reason in str(error)
        assert len(w.js.sent) == 1, "only the message before it went out"
    finally:
        w.close()


def test_a_message_too_large_for_the_stream_is_poison_and_no_stream_for_a_subject_is_poison_too(world):
    parcel = _parcel(0, 1)
    world.publisher.send(parcel, lambda: None)
    world.sent_count(1)
    world.answer(0, APIError(code=400, err_code=10054, description="message size exceeds maximum allowed"))
    world.settle(parcel)
    assert isinstance(world.publisher.failure(parcel), PoisonEventError)
    from nats.js.errors import NoStreamResponseError

    w = World()
    try:
        w.stream_of = lambda subject: None
        parcel = _parcel(0, 1)
        w.publisher.send(parcel, lambda: None)
        w.sent_count(1)
        w.answer(0, NoStreamResponseError())
        w.settle(parcel)
        error = w.publisher.failure(parcel)
        assert isinstance(error, PoisonEventError) and "no JetStream stream stores its subject" in str(error)
        w.stream_of = lambda subject: (_ for _ in ()).throw(TimeoutError("no answer"))
        assert isinstance(w.publisher.failure(parcel), DeliveryError), "JetStream not answering: try again"
    finally:
        w.close()


def test_the_event_loop_thread_passes_a_coroutines_own_timeout_error_on_as_it_is():
    """A coroutine that raises TimeoutError itself (nats-py's fetch with nothing to fetch) is not
    reported as the thread's own wait running out."""
    thread = EventLoopThread("test-timeout")
    try:

        async def fails() -> None:
            raise TimeoutError("nothing to fetch")

        with pytest.raises(TimeoutError, match="^nothing to fetch$"):
            thread.run(fails(), 5)

        async def slow() -> None:
            await asyncio.sleep(5)

        with pytest.raises(TimeoutError, match="no answer within 0.1 s"):
            thread.run(slow(), 0.1)
    finally:
        thread.close()

"""The RabbitMQ publisher's rules (relay.rabbitmq.publisher), with a fake of pika's channel: order on
the wire, a parcel acknowledged only by its confirms, a return before the ack, nacks, closes and
missing confirms failing it, nothing on the wire after the first failure, publish_by; and the
settings' checks (relay.rabbitmq.config, the broker's start-up refusal of exactly-once)."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest
from pika import spec
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from relay.config import Settings
from relay.core.errors import ConfigError, DeliveryError, LeaseUnrenewedError, PoisonEventError
from relay.core.message import OutgoingMessage
from relay.core.redact import scrub
from relay.core.window import Parcel
from relay.rabbitmq.broker import RabbitMQ
from relay.rabbitmq.config import NO_EXACTLY_ONCE
from relay.rabbitmq.publisher import RabbitPublisher, Sender

EXCHANGE = "outbox"
HEADERS = [("ce_id", b""), ("ce_type", b"Changed"), ("content-type", b"application/avro"), ("relay_fencing_token", b"3")]


class FakeChannel:
    """pika's channel as the sender uses it: every publish recorded, or refused with `fail`."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, bytes, spec.BasicProperties, bool]] = []
        self.fail: Exception | None = None

    def basic_publish(self, exchange, routing_key, body, properties=None, mandatory=False) -> None:
        if self.fail is not None:
            raise self.fail
        self.published.append((exchange, routing_key, body, properties, mandatory))

    @property
    def ids(self) -> list[str]:
        return [p[3].message_id for p in self.published]


class InlineThread:
    """The event loop thread, run inline: `call` runs the callback at once."""

    def call(self, callback, *args) -> None:
        callback(*args)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def message(i: int, topic: str = "outbox.event.order", value: bytes | None = None) -> OutgoingMessage:
    headers = [(n, f"e{i}".encode() if n == "ce_id" else v) for n, v in HEADERS]
    return OutgoingMessage(f"e{i}", topic, f"agg-{i % 2}".encode(), value or f"v{i}".encode(), headers)


def parcel(*ids: int, publish_by: float | None = None, **kw) -> Parcel:
    return Parcel([-1] * len(ids), [message(i, **kw) for i in ids], None, 0.0, publish_by=publish_by)


def ack(tag: int, multiple: bool = False) -> SimpleNamespace:
    return SimpleNamespace(method=spec.Basic.Ack(delivery_tag=tag, multiple=multiple))


def nack(tag: int) -> SimpleNamespace:
    return SimpleNamespace(method=spec.Basic.Nack(delivery_tag=tag))


class Rig:
    """A publisher and its sender over a fake channel, both sides run inline."""

    def __init__(self, frame_max: int = 131072, dead_letter: str | None = None) -> None:
        self.reports: queue.SimpleQueue = queue.SimpleQueue()
        self.clock = Clock()
        self.channel = FakeChannel()
        self.closed = 0
        self.sender = Sender(self.reports, EXCHANGE, confirm_timeout_s=5.0, clock=self.clock)
        self.sender.start(self.channel, self._close)
        self.publisher = RabbitPublisher(InlineThread(), self.sender, self.reports, frame_max, dead_letter)

    def _close(self) -> None:
        self.closed += 1

    def send(self, *parcels: Parcel) -> None:
        for p in parcels:
            self.publisher.send(p, lambda: None)

    def returned(self, event_id: str, routing_key: str) -> None:
        method = spec.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange=EXCHANGE, routing_key=routing_key)
        self.sender.on_return(None, method, spec.BasicProperties(message_id=event_id), b"")

    def take(self) -> None:
        self.publisher.poll(0)


def test_messages_go_on_the_wire_in_send_order_mandatory_and_persistent_with_the_kafka_headers():
    rig = Rig()
    rig.send(parcel(1, 2), parcel(3))
    assert rig.channel.ids == ["e1", "e2", "e3"]
    exchange, routing_key, body, props, mandatory = rig.channel.published[0]
    assert (exchange, routing_key, body, mandatory) == (EXCHANGE, "outbox.event.order", b"v1", True)
    assert props.delivery_mode == 2 and props.content_type == "application/avro" and props.type == "Changed"
    assert props.headers == {"ce_id": "e1", "ce_type": "Changed", "content-type": "application/avro",
                             "relay_fencing_token": "3", "relay_aggregate_id": "agg-1"}
    assert isinstance(props.timestamp, int)
    assert rig.publisher.queued == 3


def test_a_parcel_is_acknowledged_only_once_every_message_of_it_was_confirmed_in_any_order():
    rig = Rig()
    first, second = parcel(1, 2, 3), parcel(4)
    rig.send(first, second)
    rig.sender.on_confirm(ack(2))
    rig.sender.on_confirm(ack(4))
    rig.take()
    assert not first.done and second.acknowledged
    rig.sender.on_confirm(ack(3, multiple=True))  # covers 1 and 3
    rig.take()
    assert first.acknowledged and rig.publisher.queued == 0


def test_a_return_before_the_ack_fails_the_parcel_naming_the_event_and_routing_key_and_stops_sending():
    rig = Rig()
    before, poisoned, after = parcel(1), parcel(2, 3, topic="outbox.event.invoice"), parcel(4)
    rig.send(before, poisoned)
    rig.returned("e3", "outbox.event.invoice")
    rig.sender.on_confirm(ack(3, multiple=True))  # the returned message is acked too, after its return
    rig.send(after)
    rig.take()
    assert before.acknowledged, "what precedes the poison event is still confirmed"
    error = rig.publisher.failure(poisoned)
    assert isinstance(error, PoisonEventError) and error.event_id == "e3"
    assert "outbox.event.invoice" in str(error) and "unroutable" in str(error)
    assert after.failure is not None and rig.channel.ids == ["e1", "e2", "e3"], "nothing more on the wire"
    assert isinstance(rig.publisher.failure(after), DeliveryError)


def test_a_returned_dead_letter_stops_the_relay_naming_the_dead_letter_setting():
    rig = Rig(dead_letter="outbox.deadletter")
    dead = parcel(1, topic="outbox.deadletter")
    rig.send(dead)
    rig.returned("e1", "outbox.deadletter")
    rig.take()
    error = rig.publisher.failure(dead)
    assert isinstance(error, ConfigError) and str(error).startswith("RELAY_DEAD_LETTER_TOPIC:")


def test_a_nack_fails_its_parcel_for_a_restart_and_nothing_more_is_sent():
    rig = Rig()
    first, second = parcel(1, 2), parcel(3)
    rig.send(first)
    rig.sender.on_confirm(nack(2))
    rig.send(second)
    rig.take()
    assert first.failure is not None and first.failed_event_id() == "e2"
    assert isinstance(rig.publisher.failure(first), DeliveryError)
    assert rig.channel.ids == ["e1", "e2"] and second.failure is not None


@pytest.mark.parametrize("reason", [ChannelClosedByBroker(541, "INTERNAL_ERROR"),
                                    ConnectionClosedByBroker(320, "CONNECTION_FORCED - broker forced connection closure")])
def test_a_closed_channel_or_connection_fails_every_parcel_in_flight(reason):
    rig = Rig()
    first, second, later = parcel(1, 2), parcel(3), parcel(4)
    rig.send(first, second)
    rig.sender.on_confirm(ack(1))
    rig.sender.on_closed(reason)
    rig.send(later)
    rig.take()
    assert all(p.failure is not None for p in (first, second, later))
    assert first.failed_event_id() == "e2", "the first unconfirmed message"
    error = rig.publisher.failure(first)
    assert isinstance(error, DeliveryError) and str(reason.reply_code) in str(error)
    assert rig.channel.ids == ["e1", "e2", "e3"]


def test_a_message_over_max_message_size_is_named_poison_when_the_channel_closes_over_it():
    rig = Rig()
    big = parcel(1, 2, value=b"x" * 5000)
    rig.send(parcel(0), big)
    rig.sender.on_closed(ChannelClosedByBroker(406, "PRECONDITION_FAILED - message size 5000 is larger than "
                                                    "configured max size 4096"))
    rig.take()
    error = rig.publisher.failure(big)
    assert isinstance(error, PoisonEventError) and error.event_id == "e1" and "max_message_size" in str(error)


def test_a_missing_confirm_fails_everything_in_flight_and_closes_the_connection():
    rig = Rig()
    first = parcel(1)
    rig.send(first)
    rig.clock.now += 4.9
    rig.sender.check_confirms()
    assert rig.closed == 0
    rig.sender.on_blocked("low on memory")
    rig.clock.now += 0.2
    rig.sender.check_confirms()
    rig.take()
    assert rig.closed == 1 and first.failure is not None
    error = rig.publisher.failure(first)
    assert isinstance(error, DeliveryError) and "within 5 s" in str(error) and "low on memory" in str(error)


def test_a_parcel_whose_publish_by_passed_is_not_sent():
    rig = Rig()
    late = parcel(1, publish_by=rig.clock.now - 0.001)
    rig.send(late, parcel(2))
    rig.take()
    assert rig.channel.published == []
    assert isinstance(rig.publisher.failure(late), LeaseUnrenewedError)


def test_a_failure_to_put_a_message_on_the_wire_fails_the_parcel_and_closes_the_connection():
    rig = Rig()
    rig.channel.fail = ConnectionResetError("gone")
    broken = parcel(1)
    rig.send(broken)
    rig.take()
    assert rig.closed == 1 and isinstance(rig.publisher.failure(broken), DeliveryError)


def test_a_message_amqp_cannot_carry_is_poison_named_and_the_ones_before_it_are_sent():
    rig = Rig(frame_max=4096)
    huge = message(2)
    huge.headers.append(("note", b"n" * 5000))
    mixed = Parcel([-1, -1], [message(1), huge], None, 0.0)
    rig.send(mixed)
    rig.sender.on_confirm(ack(1))
    rig.take()
    assert rig.channel.ids == ["e1"]
    error = rig.publisher.failure(mixed)
    assert isinstance(error, PoisonEventError) and error.event_id == "e2" and "frame_max 4096" in str(error)


def test_a_header_value_that_is_not_utf8_travels_as_bytes_unchanged():
    rig = Rig()
    odd = message(1)
    odd.headers.append(("blob", b"\xff\x00"))
    rig.send(Parcel([-1], [odd], None, 0.0))
    assert rig.channel.published[0][3].headers["blob"] == b"\xff\x00"


# ---- settings --------------------------------------------------------------------------------


def test_exactly_once_is_refused_at_start_with_one_line_saying_what_to_use():
    broker = RabbitMQ(Settings().replace(broker="rabbitmq", delivery="exactly-once").parts().rabbitmq, None)
    try:
        with pytest.raises(ConfigError) as refused:
            broker.check_settings()
    finally:
        broker.close()
    assert str(refused.value) == f"RELAY_DELIVERY: {NO_EXACTLY_ONCE}"
    assert "RELAY_BROKER=kafka or nats" in NO_EXACTLY_ONCE and "\n" not in NO_EXACTLY_ONCE


def test_a_kafka_relay_in_exactly_once_mode_is_not_refused_by_the_rabbitmq_settings():
    Settings().replace(delivery="exactly-once").parts()


@pytest.mark.parametrize(("changes", "setting"), [
    ({"rabbitmq_url": "http://localhost:5672/"}, "RELAY_RABBITMQ_URL"),
    ({"rabbitmq_url": "amqp:///vhost"}, "RELAY_RABBITMQ_URL"),
    ({"rabbitmq_exchange": ""}, "RELAY_RABBITMQ_EXCHANGE"),
    ({"rabbitmq_exchange": "with space"}, "RELAY_RABBITMQ_EXCHANGE"),
    ({"rabbitmq_confirm_timeout_ms": 0}, "RELAY_RABBITMQ_CONFIRM_TIMEOUT_MS"),
    ({"rabbitmq_tls_ca": "/no/such/ca.pem"}, "RELAY_RABBITMQ_TLS_CA"),
    ({"broker": "amqp"}, "RELAY_BROKER"),
])
def test_a_bad_rabbitmq_setting_is_refused_naming_it(changes, setting):
    with pytest.raises(ConfigError) as refused:
        Settings().replace(**changes).parts()
    assert str(refused.value).startswith(f"{setting}:")


def test_the_url_password_is_a_secret_never_shown():
    settings = Settings.load(env={"RELAY_BROKER": "rabbitmq",
                                  "RELAY_RABBITMQ_URL": "amqp://relay:s3cr3t-pw@rabbit:5672/%2F"})
    assert "s3cr3t-pw" in settings.secrets()
    assert "s3cr3t-pw" not in repr(settings.parts().rabbitmq) and "s3cr3t-pw" not in settings.rendered()
    assert "s3cr3t-pw" not in scrub("connecting with s3cr3t-pw")

"""RabbitMQ from the tests, as an operator and a consumer would: a quorum queue bound to the
relay's exchange (`bind_queue`), and a reader that consumes it (`QueueReader`: a queue is read
once, so the reader keeps what it consumed and each `read()` adds what came since), decoding each
message as the oracle reads a Kafka record (one queue keeps one order: every record is in
"partition" 0, its offset the place it was consumed at)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pika

from harness.topics import REGISTRY, Record
from relay.core.message import HEADER_AGGREGATE_ID


@dataclass
class AmqpRecord(Record):
    """A consumed message, decoded, with its AMQP properties and routing key."""

    properties: Any = None
    raw_headers: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    redelivered: bool = False  # RabbitMQ delivered it before (to this reader: a requeue)


def _connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def bind_queue(url: str, queue: str, exchange: str, bindings: tuple[str, ...] = ("outbox.#",),
               single_active: bool = False) -> None:
    """What an operator does before the relay starts: the exchange (a durable topic exchange), a
    quorum queue (with `single_active`: x-single-active-consumer, as for an inbox), its bindings."""
    arguments = {"x-queue-type": "quorum", **({"x-single-active-consumer": True} if single_active else {})}
    connection = _connect(url)
    try:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_declare(queue, durable=True, arguments=arguments)
        for binding in bindings:
            channel.queue_bind(queue, exchange, binding)
    finally:
        connection.close()


def queue_size(url: str, queue: str) -> int:
    """Messages ready in `queue` now."""
    connection = _connect(url)
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def _declared(url: str, declare: Any) -> bool:
    """Whether `declare(channel)` (a passive declare) finds what it names."""
    connection = _connect(url)
    try:
        declare(connection.channel())
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if connection.is_open:
            connection.close()


def queue_exists(url: str, queue: str) -> bool:
    return _declared(url, lambda channel: channel.queue_declare(queue, passive=True))


def exchange_exists(url: str, exchange: str) -> bool:
    return _declared(url, lambda channel: channel.exchange_declare(exchange, passive=True))


class QueueReader:
    """Consumes `queue` (acknowledging what it keeps) and keeps every message it consumed, in order."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.records: list[AmqpRecord] = []

    def read(self, decode: bool = True) -> list[AmqpRecord]:
        """Every message consumed so far, with those ready now."""
        connection = _connect(self.url)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=1000)
            last = acked = 0
            for method, properties, body in channel.consume(self.queue, inactivity_timeout=0.5):
                if method is None:
                    break
                self.records.append(_record(method, properties, body, len(self.records), decode))
                last = method.delivery_tag
                if last - acked >= 500:
                    channel.basic_ack(acked := last, multiple=True)
            if last > acked:
                channel.basic_ack(last, multiple=True)
            channel.cancel()
        finally:
            if connection.is_open:
                connection.close()
        return list(self.records)


def redelivered(records: list[AmqpRecord]) -> str:
    """What a failed order check adds: which records were redelivered (a requeue by the reader puts
    a message back; the relay's republish after a failure sends a new one)."""
    again = [r.offset for r in records if r.redelivered]
    return f"{len(records)} records, redelivered at offsets {again[:20]} ({len(again)} in all)"


def _record(method: Any, properties: Any, body: bytes, offset: int, decode: bool) -> AmqpRecord:
    raw = dict(properties.headers or {})
    headers = {k: v if isinstance(v, str) else bytes(v).decode(errors="replace") for k, v in raw.items()}
    event = REGISTRY.decode(body) if decode else {}
    return AmqpRecord(method.routing_key, 0, offset, headers.get(HEADER_AGGREGATE_ID, ""), event, headers,
                      properties=properties, raw_headers=raw, body=body, redelivered=method.redelivered)

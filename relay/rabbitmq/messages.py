"""A relay message as an AMQP 0-9-1 message: the routing key is the topic, the body the Kafka
value's bytes (Avro), the properties `message_id` = the event id (ce_id), `content_type`,
persistent delivery, `timestamp` (when the relay published it, in seconds: the event's own time is
`ce_time`) and `type` = the event type (ce_type); the headers the Kafka headers' names and values,
with the aggregate id (Kafka's key) in `relay_aggregate_id`. A header value that is UTF-8 travels as
a string (AMQP's longstr), any other as a byte array (`x`): either way its bytes are unchanged.

What AMQP cannot carry unchanged makes the event poison, named (relay.core.handover.Refused): a routing key or header
name longer than 255 bytes (AMQP's short strings), or properties too large for one frame (the
content header is never split: `frame_max`, which the server announces).
"""

from __future__ import annotations

from typing import Any

from pika import BasicProperties, DeliveryMode

from relay.core.handover import Refused
from relay.core.message import HEADER_AGGREGATE_ID, HEADER_CONTENT_TYPE, OutgoingMessage

HEADER_TYPE = "ce_type"
SHORT_STRING_MAX = 255
# A content header frame's fixed part (frame header and end, class, weight, body size, flags) and
# each property's own bytes, counted generously; each table entry adds its name's length byte, a
# type byte and a 4-byte length.
_HEADER_FRAME_OVERHEAD = 8 + 14 + 64
_ENTRY_OVERHEAD = 1 + 1 + 4

Message = tuple[str, bytes, BasicProperties]


def to_amqp(m: OutgoingMessage, timestamp: int, frame_max: int) -> Message:
    """(routing key, body, properties) of `m`; Refused naming what AMQP cannot carry."""
    if len(m.topic.encode()) > SHORT_STRING_MAX:
        raise Refused(f"routing key {m.topic[:40]!r}... is longer than AMQP's {SHORT_STRING_MAX} bytes")
    headers: dict[str, Any] = {}
    size = _HEADER_FRAME_OVERHEAD + len(m.event_id)
    for name, raw in [*m.headers, (HEADER_AGGREGATE_ID, m.key)]:
        if len(name.encode()) > SHORT_STRING_MAX:
            raise Refused(f"header name {name[:40]!r}... is longer than AMQP's {SHORT_STRING_MAX} bytes")
        headers[name] = _value(raw)
        size += len(name) + len(raw) + _ENTRY_OVERHEAD
    content_type, event_type = headers.get(HEADER_CONTENT_TYPE), headers.get(HEADER_TYPE)
    size += len(content_type or "") + len(event_type or "")
    if size > frame_max:
        raise Refused(
            f"its properties and headers take about {size} bytes, more than the one AMQP frame they must fit in "
            f"(frame_max {frame_max})"
        )
    properties = BasicProperties(
        content_type=content_type if isinstance(content_type, str) else None,
        delivery_mode=DeliveryMode.Persistent.value,
        headers=headers,
        message_id=m.event_id,
        timestamp=timestamp,
        type=event_type if isinstance(event_type, str) else None,
    )
    return m.topic, m.value, properties


def _value(raw: bytes) -> str | bytes:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw

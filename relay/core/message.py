"""The Kafka record the relay hands to the producer, and the names and rules every record shares.

These are the one source of the message format's fixed names: the encoders (the Python path in
relay.avro.encoding and the compiled one, relay._native, which receives them when it is built),
dead letters and the Spark jobs read them from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The header that carries the lease's fencing token on every record (events and dead letters).
HEADER_FENCING = "relay_fencing_token"
# The header carrying the aggregate id (Kafka's key) on a broker whose messages have no key of
# their own (NATS JetStream, RabbitMQ).
HEADER_AGGREGATE_ID = "relay_aggregate_id"
HEADER_CONTENT_TYPE = "content-type"
# The header `outbox-relay replay` adds to each message it publishes again: the replay's id (a
# UUID), so a consumer can tell a replay from the live stream (docs/replay.md).
HEADER_REPLAY = "relay_replay"
# CloudEvents' attributes in Kafka binary mode, in the order every record carries them.
CE_HEADERS = ("ce_id", "ce_type", "ce_source", "ce_specversion", "ce_time", "ce_subject")
# W3C trace context: an outbox document's `headers.traceparent` / `tracestate` (OutboxEvent.new
# records them) pass through as Kafka headers of the same names, which OpenTelemetry's Kafka
# instrumentation reads, and are copied to the CloudEvents distributed-tracing extension's
# attributes (`ce_traceparent`, `ce_tracestate`) for CloudEvents SDKs (docs/trace-context.md).
TRACE_HEADERS = (("traceparent", "ce_traceparent"), ("tracestate", "ce_tracestate"))
# Header names an outbox document may not use in its own `headers`: CloudEvents' (`ce_`), the
# content type, and the relay's own (`relay_`).
RESERVED_HEADER_PREFIXES = ("ce_", "content-type", "relay_")
CONTENT_TYPE_AVRO = b"application/avro"
CONTENT_TYPE_JSON = b"application/json"
CE_SPECVERSION = b"1.0"

# Kafka's rule for topic names: letters, digits and these, 1-249 long, not "." or "..".
TOPIC_MAX_LENGTH = 249
TOPIC_PUNCTUATION = "._-"
TOPIC_NAME_PATTERN = rf"^[A-Za-z0-9{re.escape(TOPIC_PUNCTUATION)}]{{1,{TOPIC_MAX_LENGTH}}}$"
_TOPIC_NAME = re.compile(TOPIC_NAME_PATTERN)


def valid_topic(name: str) -> bool:
    """Whether Kafka accepts `name` as a topic name (legal characters, 1-249 long, not . or ..)."""
    return bool(_TOPIC_NAME.match(name)) and name not in (".", "..")


def event_id_of(doc: Mapping[str, Any]) -> str:
    """The event id of an outbox document as text, for messages and logs, even for a malformed one."""
    return str(doc.get("_id", "<no _id>"))


@dataclass(slots=True)
class OutgoingMessage:
    """One Kafka record, ready for the producer."""

    event_id: str
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]

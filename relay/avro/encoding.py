"""Outbox events as Kafka messages: the envelope record, its Avro value, the headers.

Every event is written with one of the schema folder's writer schemas (relay.avro.folder,
relay.avro.contract): the typed envelope for its event type when `schemas/events/` has one (the
payload converted by the BSON -> Avro mapping of relay.avro.mapping, checked at publish time),
else the generic envelope `io.outboxrelay.v1.OutboxEvent` with the payload as relaxed Extended
JSON text. Every value identifies its writer schema (relay.avro.framing): Avro single-object
encoding by default (`schemas/` is the registry: readers find the writer schema by
fingerprint), the Confluent wire format when a Schema Registry URL is configured.

Headers follow CloudEvents' Kafka binary mode (ce_id, ce_type, ce_source, ce_specversion,
ce_time, ce_subject, content-type), then the fencing token (`relay_fencing_token`), then the
outbox document's own headers, then the CloudEvents copies of its trace context
(`ce_traceparent`, `ce_tracestate`; relay.core.message names them all).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import string
from collections.abc import Mapping, Sequence
from typing import Any

from bson import Code, json_util
from bson.json_util import RELAXED_JSON_OPTIONS

from relay.avro.config import EncodingConfig
from relay.avro.deadletter import dead_letter_message
from relay.avro.folder import SchemaFolder, WriterSchema
from relay.avro.framing import Framing, SingleObjectFraming
from relay.avro.mapping import UnmappableValueError
from relay.avro.native_program import native_program
from relay.core.change import Change
from relay.core.errors import PoisonEventError
from relay.core.message import (
    CE_HEADERS,
    CE_SPECVERSION,
    CONTENT_TYPE_AVRO,
    HEADER_CONTENT_TYPE,
    HEADER_FENCING,
    RESERVED_HEADER_PREFIXES,
    TOPIC_MAX_LENGTH,
    TOPIC_PUNCTUATION,
    TRACE_HEADERS,
    OutgoingMessage,
    event_id_of,
    valid_topic,
)
from relay.outbox import MalformedEventError, OutboxEvent, decode, parse

# Bytes Kafka adds around key, value and headers in a record batch; kept generous.
RECORD_OVERHEAD = 512

log = logging.getLogger("relay")

# Said once per process when the compiled module is missing. The price: CPU per event of reading
# a change and building its message (generic envelope, 3-field payload), Python against compiled,
# measured by bench/encoding.py (docs/native.md, "Without it").
PYTHON_PATH_WARNING = (
    "relay._native is not installed (a source install without Rust): change events are read and "
    "messages built in Python, about %dx the CPU per event of the compiled module (measured %d us "
    "against %d us); install the outbox-relay wheel, or build from source with cargo on PATH"
)
PYTHON_PATH_PRICE = (8, 106, 13)


_JSON_DEFAULT = functools.partial(json_util.default, json_options=RELAXED_JSON_OPTIONS)


def _holds_code(payload: Mapping[str, Any]) -> bool:
    """Whether a decoded document holds JavaScript code anywhere (a `str` subclass)."""
    stack: list[Any] = [payload]
    while stack:
        value = stack.pop()
        kind = value.__class__
        if kind is dict:
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif kind is Code:
            return True
    return False


def relaxed_json(payload: Mapping[str, Any]) -> str:
    """The payload as relaxed Extended JSON v2, exactly as `json_util.dumps` writes it.

    Fast path: the standard library's C encoder handles plain values and calls
    `json_util.default` only for BSON types (ObjectId, dates, Decimal128, binary, ...). Two
    cases take json_util's own, slower path: NaN and infinities (relaxed mode writes
    {"$numberDouble": ...}) and JavaScript code, a `str` subclass the C encoder would write as
    a plain string.
    """
    if not _holds_code(payload):
        try:
            return json.dumps(payload, default=_JSON_DEFAULT, allow_nan=False)
        except ValueError:
            pass
    return json_util.dumps(payload, json_options=RELAXED_JSON_OPTIONS)


def _rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class MessageBuilder:
    """Turns a change (relay.core.change.Change) into the Kafka message; bad events raise
    PoisonEventError. It reads the outbox document from the change's bytes, and the envelope's
    `source.position` and `source.clusterTime` from the change's position and cluster time.

    `framing` defaults to single-object encoding with the folder (relay.avro.framing). With
    `native` (the default) and single-object framing, `build_many` first hands a batch to the
    compiled encoder (`relay._native`, native/src), which builds generic and typed envelopes
    (typed payloads compiled for it by relay.avro.native_program) and declines everything else
    (malformed documents, payloads the mapping refuses, values it does not write exactly as this
    module does); `build` (this module) makes the rest, so both give the same bytes and the same
    errors (tests/unit/test_native.py).
    """

    def __init__(
        self, config: EncodingConfig, registry: SchemaFolder, framing: Framing | None = None, native: bool = True
    ) -> None:
        self._config = config
        self._fields = config.fields
        self._registry = registry
        self._framing = framing or SingleObjectFraming(registry)
        self._template = config.event_topic_template
        self._source = config.cloudevents_source.encode()
        self._outbox = config.outbox
        self._max_bytes = config.max_message_bytes
        self._native = (
            _native_encoder(config, registry) if native and isinstance(self._framing, SingleObjectFraming) else None
        )
        if native and self._native is None and _compiled() is None:
            _warn_python_path()

    @property
    def native(self) -> bool:
        """Whether `build_many` uses the compiled encoder."""
        return self._native is not None

    def build_many(self, changes: Sequence[Change], fencing_token: int) -> list[OutgoingMessage | None]:
        """Messages for the changes the compiled encoder takes, None for the others, in the same
        order: build those with `build`."""
        if self._native is None:
            return [None] * len(changes)
        return self._native.encode(changes if isinstance(changes, list) else list(changes), fencing_token)  # type: ignore[no-any-return]

    def build(self, change: Change, fencing_token: int) -> OutgoingMessage:
        """The message for one change; raises PoisonEventError naming the event."""
        doc = decode(change.document)
        event_id = event_id_of(doc)
        try:
            event = parse(doc, self._fields)
            topic = self._topic(event)
            headers = self._headers(event, fencing_token)
        except MalformedEventError as exc:
            raise PoisonEventError(event_id, f"malformed outbox document: {exc}") from exc
        writer = self._registry.writer_for(event.event_type)
        record = self._record(event_id, event, self._payload(event_id, event, writer), change)
        try:
            value = self._framing.encode(writer.name, record, topic)
        except (ValueError, TypeError, OverflowError) as exc:
            raise PoisonEventError(event_id, f"cannot be Avro-encoded with {writer.name}: {exc}") from exc
        key = event.aggregate_id.encode()
        size = len(key) + len(value) + RECORD_OVERHEAD + sum(len(k) + len(v) for k, v in headers)
        if size > self._max_bytes:
            raise PoisonEventError(
                event_id,
                f"message of about {size} bytes exceeds message.max.bytes "
                f"({self._max_bytes}, RELAY_KAFKA_MESSAGE_MAX_BYTES)",
            )
        return OutgoingMessage(event_id, topic, key, value, headers)

    def _topic(self, event: OutboxEvent) -> str:
        """The event's topic: its own, or the template's; MalformedEventError when invalid."""
        topic = event.topic or self._template.format(aggregateType=event.aggregate_type, eventType=event.event_type)
        if not valid_topic(topic):
            raise MalformedEventError(
                self._fields.topic if event.topic else self._fields.aggregate_type,
                f"gives an invalid Kafka topic name {topic!r}",
            )
        return topic

    @staticmethod
    def _payload(event_id: str, event: OutboxEvent, writer: WriterSchema) -> Any:
        """The payload as the writer schema carries it: relaxed Extended JSON text (generic), or
        the typed record (PoisonEventError naming the field the schema refuses)."""
        if writer.mapper is None:
            return relaxed_json(event.payload)
        try:
            return writer.mapper.convert(event.payload)
        except UnmappableValueError as exc:
            raise PoisonEventError(
                event_id, f"payload does not match schema {writer.name} (schemas/{writer.path}): {exc}"
            ) from exc

    def _record(self, event_id: str, event: OutboxEvent, payload: Any, change: Change) -> dict[str, Any]:
        """The envelope record of the event, with its position in the change stream."""
        cluster_time = change.cluster_time
        return {
            "id": event_id,
            "aggregateType": event.aggregate_type,
            "aggregateId": event.aggregate_id,
            "eventType": event.event_type,
            "occurredAt": event.occurred_at,
            "payload": payload,
            "source": {
                "database": self._outbox.database,
                "collection": self._outbox.collection,
                "clusterTime": (cluster_time.time << 32 | cluster_time.inc) if cluster_time else 0,
                "position": change.position["_data"],
            },
        }

    def dead_letter(self, change: Change, reason: str, fencing_token: int) -> OutgoingMessage:
        """The dead-letter record that stands in for a poison event (relay.avro.deadletter)."""
        return dead_letter_message(change, reason, fencing_token, self._config)

    def _headers(self, event: Any, fencing_token: int) -> list[tuple[str, bytes]]:
        ce_values = (
            event.id_str.encode(),
            event.event_type.encode(),
            self._source,
            CE_SPECVERSION,
            _rfc3339(event.occurred_at).encode(),
            event.aggregate_id.encode(),
        )
        headers = [*zip(CE_HEADERS, ce_values, strict=True)]
        headers += [(HEADER_CONTENT_TYPE, CONTENT_TYPE_AVRO), (HEADER_FENCING, str(fencing_token).encode())]
        own = event.headers or {}
        for name, value in own.items():
            if name.startswith(RESERVED_HEADER_PREFIXES):
                raise MalformedEventError(f"{self._fields.headers}.{name}", "uses a header name the relay reserves")
            headers.append((name, value.encode()))
        # The trace context, also as the CloudEvents distributed-tracing extension's attributes.
        headers += [(copy, own[name].encode()) for name, copy in TRACE_HEADERS if name in own]
        return headers


@functools.cache
def _compiled() -> Any:
    """The compiled module (relay._native), or None in an install without it."""
    try:
        from relay import _native
    except ImportError:
        return None
    return _native


@functools.cache
def _warn_python_path() -> None:
    """The one WARNING of a process whose messages are all built in Python."""
    log.warning(PYTHON_PATH_WARNING, *PYTHON_PATH_PRICE)


def _native_encoder(config: EncodingConfig, folder: SchemaFolder) -> Any:
    """The compiled encoder for this configuration, or None where it cannot match `build` exactly (a
    topic template with format specs, conversions or attribute lookups) or where this install has
    no compiled module."""
    _native = _compiled()
    if _native is None:
        return None
    template: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in string.Formatter().parse(config.event_topic_template):
        if spec or conversion or field not in (None, "aggregateType", "eventType"):
            return None
        template.append((literal, field))
    generic = folder.writer_for("").name  # the generic envelope: what every untyped event gets
    typed = []
    for event_type in folder.event_types:
        writer = folder.writer_for(event_type)
        root, nodes = native_program(writer.payload, writer.named)
        typed.append((event_type, folder.fingerprint(writer.name), root, nodes))
    fields = config.fields
    return _native.Encoder(
        (
            fields.aggregate_type,
            fields.aggregate_id,
            fields.event_type,
            fields.payload,
            fields.occurred_at,
            fields.headers,
            fields.topic,
        ),
        template,
        typed,
        folder.fingerprint(generic),
        config.outbox.database,
        config.outbox.collection,
        config.cloudevents_source.encode(),
        config.max_message_bytes,
        RECORD_OVERHEAD,
        OutgoingMessage,
        NATIVE_NAMES,
        Change,
    )


# What the compiled encoder takes from relay.core.message instead of retyping it.
NATIVE_NAMES = (
    list(CE_HEADERS),
    HEADER_CONTENT_TYPE,
    HEADER_FENCING,
    list(RESERVED_HEADER_PREFIXES),
    list(TRACE_HEADERS),
    CE_SPECVERSION,
    CONTENT_TYPE_AVRO,
    TOPIC_MAX_LENGTH,
    TOPIC_PUNCTUATION,
)

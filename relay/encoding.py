"""Avro encoding of outbox events: the schema folder, the envelope record, Kafka headers.

Every event is written with one of the folder's writer schemas (see `relay.contract`): the
typed envelope for its event type when `schemas/events/` has one (the payload converted by the
BSON -> Avro mapping of `relay.avro_types`, checked at publish time), else the generic
envelope `io.outboxrelay.v1.OutboxEvent` with the payload as relaxed Extended JSON text.
Every value identifies its writer schema (`relay.framing`): Avro single-object encoding by
default (`schemas/` is the registry: readers find the writer schema by fingerprint), the
Confluent wire format when a Schema Registry URL is configured.

Headers follow CloudEvents' Kafka binary mode (ce_id, ce_type, ce_source, ce_specversion,
ce_time, ce_subject, content-type), then the fencing token (`relay_fencing_token`), then the
outbox document's own headers.
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import bson
import fastavro
from bson import Code, json_util
from bson.json_util import RELAXED_JSON_OPTIONS
from bson.raw_bson import RawBSONDocument

from relay.avro_types import PayloadMapper, UnmappableValueError
from relay.changes import CHANGE_CODEC, token_cluster_time
from relay.config import Settings
from relay.contract import ENVELOPE, PAYLOAD_FIELD, SchemaError, SchemaFile, contract_of, load_folder, parse_file
from relay.deadletter import dead_letter_message
from relay.errors import PoisonEventError
from relay.framing import SINGLE_OBJECT_MAGIC, Framing, SingleObjectFraming, framing_for
from relay.message import HEADER_FENCING, OutgoingMessage, valid_topic
from relay.outbox import FieldNames, MalformedEventError, event_id_of, parse

CONTENT_TYPE = b"application/avro"
_RESERVED_HEADERS = ("ce_", "content-type", "relay_")
# Bytes Kafka adds around key, value and headers in a record batch; kept generous.
_RECORD_OVERHEAD = 512

__all__ = ["ENVELOPE", "HEADER_FENCING", "SINGLE_OBJECT_MAGIC", "MessageBuilder", "OutgoingMessage",
           "SchemaFolder", "SchemaRegistry"]


@dataclass(frozen=True)
class WriterSchema:
    """The schema an event type is written with; `mapper` converts a typed payload (None: generic)."""

    name: str
    path: str
    mapper: PayloadMapper | None


class SchemaFolder:
    """The writer schemas of a schema folder, by full name, by fingerprint and by event type.

    This is the local folder (`schemas/`), not a Schema Registry server: for that, see
    `relay.framing` and confluent-kafka's `SchemaRegistryClient`. (Until 0.2 this class was
    called `SchemaRegistry`; that name stays as an alias for one release.)

    Construction checks the folder against the contract (`relay.contract`) and raises
    SchemaError naming the file that breaks it, so a bad schema stops the relay at start.
    Historical schemas (`history/`) are used for decoding only.
    """

    def __init__(self, folder: Traversable | Path) -> None:
        self._files: list[SchemaFile] = []
        self._by_name: dict[str, SchemaFile] = {}
        self._by_fingerprint: dict[bytes, SchemaFile] = {}
        self._writers: dict[str, WriterSchema] = {}
        self._generic: WriterSchema
        self._rebuild(load_folder(folder))

    @classmethod
    def bundled(cls) -> SchemaFolder:
        """The schemas shipped with the package (the repository's `schemas/` folder)."""
        return cls(resources.files("relay_schemas"))

    def add(self, schema: Mapping[str, Any], path: str | None = None) -> None:
        """Add one schema (a typed envelope needs its top-level "eventType"), re-checking the
        contract; `path` is where it would live in the folder (default from its event type)."""
        event_type = schema.get("eventType")
        path = path or (f"events/{event_type}.avsc" if event_type else f"{schema.get('name')}.avsc")
        added = parse_file(path, json.dumps(schema))
        self._rebuild([f for f in self._files if f.path != path] + [added])

    def _rebuild(self, files: list[SchemaFile]) -> None:
        contract = contract_of(files)
        self._files = files
        self._by_fingerprint = {f.fingerprint: f for f in files}
        self._by_name = {f.name: f for f in files if f.historical}
        self._by_name.update({f.name: f for f in files if not f.historical})
        self._generic = WriterSchema(contract.generic.name, contract.generic.path, None)
        writers = {}
        for event_type, f in contract.typed.items():
            payload = next(x for x in f.parsed["fields"] if x["name"] == PAYLOAD_FIELD)
            try:
                mapper = PayloadMapper(payload["type"], f.parsed["__named_schemas"])
            except ValueError as exc:
                raise SchemaError(f.path, str(exc)) from None
            writers[event_type] = WriterSchema(f.name, f.path, mapper)
        self._writers = writers

    # ---- lookups ------------------------------------------------------------------------------

    def writer_for(self, event_type: str) -> WriterSchema:
        """The typed envelope for `event_type` if the folder has one, else the generic envelope."""
        return self._writers.get(event_type, self._generic)

    @property
    def event_types(self) -> list[str]:
        return sorted(self._writers)

    @property
    def files(self) -> list[SchemaFile]:
        return list(self._files)

    def schema(self, name: str) -> Any:
        """The parsed (fastavro) current schema with this full name."""
        return self._by_name[name].parsed

    def raw(self, name: str) -> Mapping[str, Any]:
        """The schema's JSON as written in its file."""
        return self._by_name[name].raw

    def fingerprint(self, name: str) -> bytes:
        return self._by_name[name].fingerprint

    # ---- single-object encoding ---------------------------------------------------------------

    def encode(self, name: str, record: Mapping[str, Any]) -> bytes:
        """Single-object encoding of `record` with the named schema."""
        schema = self._by_name[name]
        buf = io.BytesIO()
        buf.write(SINGLE_OBJECT_MAGIC)
        buf.write(schema.fingerprint)
        fastavro.schemaless_writer(buf, schema.parsed, dict(record))
        return buf.getvalue()

    def decode(self, value: bytes) -> dict[str, Any]:
        """Decode a single-object encoded value with the writer schema its fingerprint names."""
        return self.decode_named(value)[1]

    def decode_named(self, value: bytes) -> tuple[str, dict[str, Any]]:
        """(writer schema full name, record) of a single-object encoded value."""
        if value[:2] != SINGLE_OBJECT_MAGIC or len(value) < 10:
            raise ValueError("not Avro single-object encoding (no C3 01 marker)")
        schema = self._by_fingerprint.get(value[2:10])
        if schema is None:
            raise ValueError(f"unknown writer schema fingerprint {value[2:10].hex()}")
        record = fastavro.schemaless_reader(io.BytesIO(value[10:]), schema.parsed, None)
        return schema.name, record  # type: ignore[return-value]


# The old name of SchemaFolder, kept for one release (0.1 -> 0.2); it never meant a Schema Registry.
SchemaRegistry = SchemaFolder

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
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class MessageBuilder:
    """Turns an insert change into the Kafka message; bad events raise PoisonEventError.

    `framing` defaults to the one the settings select (`relay.framing.framing_for`). With
    `native` (the default) and single-object framing, `build_many` first hands a batch to the
    compiled encoder (`relay._native`, native/src), which builds the generic-envelope messages
    and declines everything else (typed event types, malformed documents, payload types it does
    not write exactly as this module does); `build` (this module) makes the rest, so both give
    the same bytes and the same errors (tests/unit/test_native.py).
    """

    def __init__(self, settings: Settings, registry: SchemaFolder, framing: Framing | None = None,
                 native: bool = True) -> None:
        self._fields = FieldNames.from_settings(settings)
        self._registry = registry
        self._framing = framing or framing_for(settings, registry)
        self._template = settings.topic_template
        self._source = settings.cloudevents_source.encode()
        self._database = settings.database
        self._collection = settings.outbox_collection
        self._max_bytes = settings.max_message_bytes
        self._settings = settings
        self._native = _native_encoder(settings, registry, self._fields) \
            if native and isinstance(self._framing, SingleObjectFraming) else None

    @property
    def native(self) -> bool:
        """Whether `build_many` uses the compiled encoder."""
        return self._native is not None

    def build_many(self, changes: Sequence[Any], fencing_token: int) -> list[OutgoingMessage | None]:
        """Messages for the changes the compiled encoder takes (`RawBSONDocument` changes of
        event types without a typed schema), None for the others: build those with `build`."""
        if self._native is None:
            return [None] * len(changes)
        return self._native.encode(changes if isinstance(changes, list) else list(changes), fencing_token)  # type: ignore[no-any-return]

    def build(self, change: Mapping[str, Any], fencing_token: int) -> OutgoingMessage:
        """The message for one insert change (decoded with changes.CHANGE_CODEC, or raw); raises
        PoisonEventError naming the event."""
        change = decoded(change)
        doc = change["fullDocument"]
        event_id = event_id_of(doc)
        try:
            event = parse(doc, self._fields)
            topic = event.topic or self._template.format(
                aggregateType=event.aggregate_type, eventType=event.event_type)
            if not valid_topic(topic):
                raise MalformedEventError(self._fields.topic if event.topic else self._fields.aggregate_type,
                                          f"gives an invalid Kafka topic name {topic!r}")
            headers = self._headers(event, fencing_token)
        except MalformedEventError as exc:
            raise PoisonEventError(event_id, f"malformed outbox document: {exc}") from None
        writer = self._registry.writer_for(event.event_type)
        if writer.mapper is None:
            payload: Any = relaxed_json(event.payload)
        else:
            try:
                payload = writer.mapper.convert(event.payload)
            except UnmappableValueError as exc:
                raise PoisonEventError(event_id, f"payload does not match schema {writer.name} "
                                                 f"(schemas/{writer.path}): {exc}") from None
        token = change["_id"]
        cluster_time = change.get("clusterTime") or token_cluster_time(token)
        record = {
            "id": event_id,
            "aggregateType": event.aggregate_type,
            "aggregateId": event.aggregate_id,
            "eventType": event.event_type,
            "occurredAt": event.occurred_at,
            "payload": payload,
            "source": {
                "database": self._database,
                "collection": self._collection,
                "clusterTime": (cluster_time.time << 32 | cluster_time.inc) if cluster_time else 0,
                "position": token["_data"],
            },
        }
        try:
            value = self._framing.encode(writer.name, record, topic)
        except (ValueError, TypeError, OverflowError) as exc:
            raise PoisonEventError(event_id, f"cannot be Avro-encoded with {writer.name}: {exc}") from None
        key = event.aggregate_id.encode()
        size = len(key) + len(value) + _RECORD_OVERHEAD
        for k, v in headers:
            size += len(k) + len(v)
        if size > self._max_bytes:
            raise PoisonEventError(
                event_id, f"message of about {size} bytes exceeds message.max.bytes "
                          f"({self._max_bytes}, RELAY_KAFKA_MESSAGE_MAX_BYTES)")
        return OutgoingMessage(event_id, topic, key, value, headers)

    def dead_letter(self, change: Mapping[str, Any], reason: str, fencing_token: int) -> OutgoingMessage:
        """The dead-letter record that stands in for a poison event (relay.deadletter)."""
        return dead_letter_message(decoded(change), reason, fencing_token, self._settings)

    def _headers(self, event: Any, fencing_token: int) -> list[tuple[str, bytes]]:
        headers = [
            ("ce_id", event.id_str.encode()),
            ("ce_type", event.event_type.encode()),
            ("ce_source", self._source),
            ("ce_specversion", b"1.0"),
            ("ce_time", _rfc3339(event.occurred_at).encode()),
            ("ce_subject", event.aggregate_id.encode()),
            ("content-type", CONTENT_TYPE),
            (HEADER_FENCING, str(fencing_token).encode()),
        ]
        for name, value in (event.headers or {}).items():
            if name.startswith(_RESERVED_HEADERS):
                raise MalformedEventError(f"{self._fields.headers}.{name}",
                                          "uses a header name the relay reserves")
            headers.append((name, value.encode()))
        return headers


def decoded(change: Mapping[str, Any]) -> Mapping[str, Any]:
    """A change as the Python path reads it: a `RawBSONDocument` decoded with CHANGE_CODEC."""
    if isinstance(change, RawBSONDocument):
        return bson.decode(change.raw, CHANGE_CODEC)
    return change


def _native_encoder(settings: Settings, folder: SchemaFolder, fields: FieldNames) -> Any:
    """The compiled encoder for these settings, or None where it cannot match `build` exactly (a
    topic template with format specs, conversions or attribute lookups)."""
    from relay import _native

    template: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in string.Formatter().parse(settings.topic_template):
        if spec or conversion or field not in (None, "aggregateType", "eventType"):
            return None
        template.append((literal, field))
    generic = folder.writer_for("").name  # the generic envelope: what every untyped event gets
    return _native.Encoder(
        (fields.aggregate_type, fields.aggregate_id, fields.event_type, fields.payload, fields.occurred_at,
         fields.headers, fields.topic),
        template, folder.event_types, folder.fingerprint(generic), settings.database, settings.outbox_collection,
        settings.cloudevents_source.encode(), settings.max_message_bytes, _RECORD_OVERHEAD, OutgoingMessage)

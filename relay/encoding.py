"""Avro encoding of outbox events: the schema folder, single-object framing, Kafka headers.

Every value identifies its writer schema with Avro single-object encoding: the two bytes
C3 01, the schema's 8-byte little-endian CRC-64-AVRO fingerprint, then the Avro binary body.
`schemas/` is the registry: a reader finds the writer schema by fingerprint.

Headers follow CloudEvents' Kafka binary mode (ce_id, ce_type, ce_source, ce_specversion,
ce_time, ce_subject, content-type), then the fencing token (`relay_fencing_token`), then the
outbox document's own headers.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import bson
import fastavro
from bson import json_util
from bson.json_util import RELAXED_JSON_OPTIONS
from bson.raw_bson import RawBSONDocument
from fastavro.schema import fingerprint, to_parsing_canonical_form

from relay.changes import DECODE_CODEC, token_cluster_time
from relay.config import Settings
from relay.errors import PoisonEventError
from relay.outbox import FieldNames, MalformedEventError, event_id_of, parse

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
ENVELOPE = "io.outboxrelay.v1.OutboxEvent"
HEADER_FENCING = "relay_fencing_token"
CONTENT_TYPE = b"application/avro"
_RESERVED_HEADERS = ("ce_", "content-type", "relay_")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# Bytes Kafka adds around key, value and headers in a record batch; kept generous.
_RECORD_OVERHEAD = 512


class SchemaRegistry:
    """The writer schemas in a folder of `.avsc` files, by full name and by fingerprint."""

    def __init__(self, folder: Traversable | Path) -> None:
        self._by_name: dict[str, Any] = {}
        self._by_fingerprint: dict[bytes, Any] = {}
        self._fingerprint_of: dict[str, bytes] = {}
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".avsc"):
                self.add(json.loads(entry.read_text()))

    @classmethod
    def bundled(cls) -> SchemaRegistry:
        """The schemas shipped with the package (the repository's `schemas/` folder)."""
        return cls(resources.files("relay_schemas"))

    def add(self, schema: Mapping[str, Any]) -> None:
        parsed = fastavro.parse_schema(dict(schema))
        name = parsed["name"]
        fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
        self._by_name[name] = parsed
        self._by_fingerprint[fp] = parsed
        self._fingerprint_of[name] = fp

    def schema(self, name: str) -> Any:
        return self._by_name[name]

    def fingerprint(self, name: str) -> bytes:
        return self._fingerprint_of[name]

    def encode(self, name: str, record: Mapping[str, Any]) -> bytes:
        """Single-object encoding of `record` with the named schema."""
        buf = io.BytesIO()
        buf.write(SINGLE_OBJECT_MAGIC)
        buf.write(self._fingerprint_of[name])
        fastavro.schemaless_writer(buf, self._by_name[name], dict(record))
        return buf.getvalue()

    def decode(self, value: bytes) -> dict[str, Any]:
        """Decode a single-object encoded value with the writer schema its fingerprint names."""
        if value[:2] != SINGLE_OBJECT_MAGIC or len(value) < 10:
            raise ValueError("not Avro single-object encoding (no C3 01 marker)")
        schema = self._by_fingerprint.get(value[2:10])
        if schema is None:
            raise ValueError(f"unknown writer schema fingerprint {value[2:10].hex()}")
        return fastavro.schemaless_reader(io.BytesIO(value[10:]), schema, None)  # type: ignore[no-any-return]


@dataclass(slots=True)
class OutgoingMessage:
    """One Kafka record, ready for the producer."""

    event_id: str
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def _rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class MessageBuilder:
    """Turns an insert change into the Kafka message; bad events raise PoisonEventError."""

    def __init__(self, settings: Settings, registry: SchemaRegistry) -> None:
        self._fields = FieldNames.from_settings(settings)
        self._registry = registry
        self._template = settings.topic_template
        self._source = settings.cloudevents_source.encode()
        self._database = settings.database
        self._collection = settings.outbox_collection
        self._max_bytes = settings.max_message_bytes

    def build(self, change: RawBSONDocument, fencing_token: int) -> OutgoingMessage:
        """The message for one insert change; raises PoisonEventError naming the event."""
        doc = bson.decode(change["fullDocument"].raw, DECODE_CODEC)
        event_id = event_id_of(doc)
        try:
            event = parse(doc, self._fields)
            topic = event.topic or self._template.format(
                aggregateType=event.aggregate_type, eventType=event.event_type)
            if not _TOPIC_RE.match(topic) or topic in (".", ".."):
                raise MalformedEventError(self._fields.topic if event.topic else self._fields.aggregate_type,
                                          f"gives an invalid Kafka topic name {topic!r}")
            headers = self._headers(event, fencing_token)
        except MalformedEventError as exc:
            raise PoisonEventError(event_id, f"malformed outbox document: {exc}") from None
        token = change["_id"]
        cluster_time = token_cluster_time(token)
        record = {
            "id": event_id,
            "aggregateType": event.aggregate_type,
            "aggregateId": event.aggregate_id,
            "eventType": event.event_type,
            "occurredAt": event.occurred_at,
            "payload": json_util.dumps(event.payload, json_options=RELAXED_JSON_OPTIONS),
            "source": {
                "database": self._database,
                "collection": self._collection,
                "clusterTime": (cluster_time.time << 32 | cluster_time.inc) if cluster_time else 0,
                "position": token["_data"],
            },
        }
        try:
            value = self._registry.encode(ENVELOPE, record)
        except (ValueError, TypeError, OverflowError) as exc:
            raise PoisonEventError(event_id, f"cannot be Avro-encoded: {exc}") from None
        key = event.aggregate_id.encode()
        size = len(key) + len(value) + sum(len(k) + len(v) for k, v in headers) + _RECORD_OVERHEAD
        if size > self._max_bytes:
            raise PoisonEventError(
                event_id, f"message of about {size} bytes exceeds message.max.bytes "
                          f"({self._max_bytes}, RELAY_KAFKA_MESSAGE_MAX_BYTES)")
        return OutgoingMessage(event_id, topic, key, value, headers)

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

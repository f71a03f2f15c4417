"""A relay message as the JSON object `outbox-relay tail` prints, whatever broker carried it: the
decoded value (timestamps as RFC 3339 text, decimals as text, bytes as base64; the generic
envelope's payload as the JSON it holds) and the trace context of its headers."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import math
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.avro.framing import MessageDecoder
from relay.config import Settings
from relay.core.errors import SchemaRegistryRefusedError, SchemaRegistryUnavailableError


def to_json(value: Any) -> Any:
    """A decoded Avro value as JSON-ready data (exact: decimals and big numbers stay exact)."""
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _payload_json(schema: str, record: dict[str, Any]) -> dict[str, Any]:
    if schema == ENVELOPE and isinstance(record.get("payload"), str):
        with contextlib.suppress(ValueError):
            record = {**record, "payload": json.loads(record["payload"])}
    return record


def text_of(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="backslashreplace")


def trace_of(headers: dict[str, Any]) -> dict[str, Any] | None:
    """The W3C trace context a message carries (`traceparent`: version-traceId-spanId-flags)."""
    parent = headers.get("traceparent")
    if not isinstance(parent, str):
        return None
    parts = parent.split("-")
    trace: dict[str, Any] = {"traceparent": parent, "tracestate": headers.get("tracestate")}
    if len(parts) >= 4:
        trace.update(traceId=parts[1], spanId=parts[2], flags=parts[3])
    return trace


def decoded_into(line: dict[str, Any], value: bytes | None, topic: str, decoder: MessageDecoder) -> dict[str, Any]:
    """`line` (a message's coordinates and headers) with its trace context and its value decoded
    (or the error and the bytes in base64), as every broker's tail prints it."""
    line["trace"] = trace_of(line["headers"])
    if value is None:
        line["value"] = None
        return line
    try:
        decoded = decoder.decode(value, topic)
    except (ValueError, SchemaRegistryUnavailableError, SchemaRegistryRefusedError) as exc:
        # tail shows what it cannot decode, registry outages included, and goes on
        line["error"] = str(exc)
        line["valueBase64"] = base64.b64encode(value).decode()
        return line
    line.update(
        framing=decoded.framing,
        schema=decoded.schema,
        schemaRef=decoded.schema_ref,
        value=to_json(_payload_json(decoded.schema, decoded.record)),
    )
    return line


def reading(
    settings: Settings, outbox: str | None, decoder: MessageDecoder | None, registry: SchemaFolder | None
) -> tuple[str | None, MessageDecoder]:
    """What a broker's tail reads with: the CloudEvents source of `outbox` (one of RELAY_OUTBOXES)
    that lines are filtered by (None: every line), and the decoder (`decoder`, or one from the
    settings' registry and `registry`, the bundled schemas by default)."""
    parts = settings.parts()
    source = None
    if outbox is not None:
        [namespace] = settings.pick_outboxes(outbox)
        source = parts.encoding_for(namespace).cloudevents_source
    return source, decoder or MessageDecoder.from_config(parts.registry, registry or SchemaFolder.bundled())

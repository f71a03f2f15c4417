"""The writer schemas the pipeline can decode: every `.avsc` file of the registry folder.

`schemas/` is the registry (see relay.encoding and relay.contract): a message names its writer
schema by the 8-byte CRC-64-AVRO fingerprint after the `C3 01` marker. The folder holds the
generic envelope at the top level, typed envelopes under `events/`, and earlier versions of
changed schemas under `history/` (never written, still decoded). This module reads every `.avsc`
file under the folder, at any depth (folders named `.*` or `_*` skipped), computes the same
fingerprints as the relay's registry, and keeps each schema's JSON text for Spark's `from_avro`.
Schema files must be self-contained (as the relay's registry requires).

Every schema has the top-level fields of `io.outboxrelay.v1.OutboxEvent` (`COMMON_FIELDS`);
`payload` is either a string (the generic envelope: Extended JSON text) or another Avro type
(a typed envelope), which the decoder turns into JSON text with `to_json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException, UnknownType, fingerprint, to_parsing_canonical_form

from relay.spark import PipelineError

COMMON_FIELDS = ("id", "aggregateType", "aggregateId", "eventType", "occurredAt", "payload", "source")
SOURCE_FIELDS = ("database", "collection", "clusterTime", "position")


@dataclass(frozen=True)
class WriterSchema:
    """One registry schema: its full name, fingerprint, JSON text, and payload kind."""

    name: str
    fingerprint: bytes
    json: str
    payload_is_text: bool


def _payload_is_text(schema: dict[str, Any]) -> bool:
    payload = next(f for f in schema["fields"] if f["name"] == "payload")
    kind = payload["type"]
    if isinstance(kind, list):  # a union: text if its only non-null branch is a string
        kind = [k for k in kind if k != "null"]
        kind = kind[0] if len(kind) == 1 else kind
    return kind == "string" or (isinstance(kind, dict) and kind.get("type") == "string")


def _check_common_fields(name: str, schema: dict[str, Any]) -> None:
    fields = {f["name"]: f for f in schema.get("fields", [])}
    missing = [f for f in COMMON_FIELDS if f not in fields]
    source = fields.get("source", {}).get("type")
    source_fields = {f["name"] for f in source.get("fields", [])} if isinstance(source, dict) else set()
    missing += [f"source.{f}" for f in SOURCE_FIELDS if f not in source_fields]
    if missing:
        raise PipelineError(f"schema {name} lacks the common event fields {missing}; every schema "
                            "in the registry keeps the top-level fields of io.outboxrelay.v1.OutboxEvent")


def load_schema(text: str, origin: str) -> WriterSchema:
    """One schema from its JSON text; raises PipelineError naming `origin` when unusable."""
    try:
        schema = json.loads(text)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise ValueError("a message schema must be an Avro record")
        parsed: Any = fastavro.parse_schema(dict(schema))
    except (ValueError, TypeError, KeyError, SchemaParseException, UnknownType) as exc:
        raise PipelineError(f"{origin}: not a self-contained Avro schema: {exc}") from None
    name = str(parsed["name"])
    _check_common_fields(name, schema)
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
    return WriterSchema(name, fp, json.dumps(schema), _payload_is_text(schema))


def _schema_files(root: Traversable | Path) -> Iterator[tuple[str, str]]:
    """(relative path, text) of every `.avsc` under `root`, files before sub-folders, by name."""
    entries = sorted(root.iterdir(), key=lambda e: e.name)
    for entry in entries:
        if entry.is_file() and entry.name.endswith(".avsc"):
            yield entry.name, entry.read_text(encoding="utf-8")
    for entry in entries:
        if entry.is_dir() and not entry.name.startswith((".", "_")):
            yield from ((f"{entry.name}/{path}", text) for path, text in _schema_files(entry))


def writer_schemas(folder: Traversable | Path | str | None = None) -> list[WriterSchema]:
    """Every schema under `folder` (default: the bundled `schemas/`), one per fingerprint.

    Raises PipelineError naming the file when a schema does not parse or lacks the common fields.
    """
    root: Traversable | Path = (Path(folder) if isinstance(folder, str) else folder) \
        if folder is not None else resources.files("relay_schemas")
    found: dict[bytes, WriterSchema] = {}
    for path, text in _schema_files(root):
        schema = load_schema(text, path)
        found.setdefault(schema.fingerprint, schema)
    if not found:
        raise PipelineError(f"no .avsc schemas in {root}")
    return list(found.values())

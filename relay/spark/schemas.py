"""The writer schemas the pipeline can decode: every `.avsc` file of the registry folder.

`schemas/` is the registry (see relay.avro.encoding and relay.avro.contract): a message names its writer
schema by the 8-byte CRC-64-AVRO fingerprint after the `C3 01` marker. The folder holds the
generic envelope at the top level, typed envelopes under `events/`, and earlier versions of
changed schemas under `history/` (never written, still decoded). This module reads every `.avsc`
file under the folder, at any depth (folders named `.*` or `_*` skipped), computes the same
fingerprints as the relay's registry, and keeps each schema's JSON text for Spark's `from_avro`.
Schema files must be self-contained (as the relay's registry requires).

Every schema has the top-level fields of `io.outboxrelay.v1.OutboxEvent` (`COMMON_FIELDS`);
`payload` is either a string (the generic envelope: Extended JSON text) or another Avro type
(a typed envelope), which the decoder turns into JSON text with `to_json`.

Values in the Confluent wire format (the relay with `RELAY_SCHEMA_REGISTRY_URL` set) name their
writer schema by a Schema Registry id instead. Given the registry (`RegistryAccess`), the job
reads, when it starts, the id of every version of every subject and fetches each id's schema
once (`registry_schemas`); each Avro outbox event schema among them is attached to the folder
schema with the same fingerprint (`confluent_ids`), or becomes a writer schema of its own when
the folder lacks it. Schemas that are not outbox events (other teams' subjects) are left out.
A schema registered after the job started is not known to it: a value written with it is
undecodable until the job restarts (from its checkpoint: nothing is skipped).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException, UnknownType, fingerprint, to_parsing_canonical_form

from relay.core.errors import ServerUnreachableError
from relay.core.redact import Secret, Uri, hold_masked
from relay.spark import PipelineError

log = logging.getLogger("relay.spark.schemas")

COMMON_FIELDS = ("id", "aggregateType", "aggregateId", "eventType", "occurredAt", "payload", "source")
SOURCE_FIELDS = ("database", "collection", "clusterTime", "position")


@dataclass(frozen=True)
class WriterSchema:
    """One writer schema: its full name, fingerprint, JSON text, payload kind, and the Schema
    Registry ids it is registered under (values in the Confluent wire format name it by those)."""

    name: str
    fingerprint: bytes
    json: str
    payload_is_text: bool
    confluent_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class RegistryAccess:
    """The Schema Registry the relay writes the Confluent wire format with (the relay's
    RELAY_SCHEMA_REGISTRY_URL and RELAY_SCHEMA_REGISTRY_BASIC_AUTH), rendered masked (`Uri`,
    `Secret`)."""

    url: Uri
    basic_auth: Secret = field(default_factory=Secret)

    def __post_init__(self) -> None:
        hold_masked(self, uris=["url"], secrets=["basic_auth"])

    @classmethod
    def from_settings(cls, settings: Any) -> RegistryAccess | None:
        """None when the settings name no registry."""
        url = settings.schema_registry_url
        return cls(Uri(url), Secret(settings.schema_registry_basic_auth)) if url else None


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
        raise PipelineError(
            f"schema {name} lacks the common event fields {missing}; every schema "
            "in the registry keeps the top-level fields of io.outboxrelay.v1.OutboxEvent"
        )


def load_schema(text: str, origin: str) -> WriterSchema:
    """One schema from its JSON text; raises PipelineError naming `origin` when unusable."""
    try:
        schema = json.loads(text)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise ValueError("a message schema must be an Avro record")
        parsed: Any = fastavro.parse_schema(dict(schema))
    except (ValueError, TypeError, KeyError, SchemaParseException, UnknownType) as exc:
        raise PipelineError(f"{origin}: not a self-contained Avro schema: {exc}") from exc
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


def writer_schemas(
    folder: Traversable | Path | str | None = None, registry: RegistryAccess | None = None
) -> list[WriterSchema]:
    """Every schema under `folder` (default: the bundled `schemas/`), one per fingerprint, with
    the ids `registry` (if given) holds them under, plus the registry's other outbox schemas.

    Raises PipelineError naming the file when a schema does not parse or lacks the common fields,
    ServerUnreachableError when the registry cannot be read.
    """
    root: Traversable | Path = (
        (Path(folder) if isinstance(folder, str) else folder)
        if folder is not None
        else resources.files("relay_schemas")
    )
    found: dict[bytes, WriterSchema] = {}
    for path, text in _schema_files(root):
        schema = load_schema(text, path)
        found.setdefault(schema.fingerprint, schema)
    if not found:
        raise PipelineError(f"no .avsc schemas in {root}")
    schemas = list(found.values())
    return with_registry_ids(schemas, registry_schemas(registry)) if registry is not None else schemas


def with_registry_ids(schemas: list[WriterSchema], registered: Mapping[int, str]) -> list[WriterSchema]:
    """`schemas` with each registry id (id -> schema text) attached to the schema of the same
    fingerprint; an outbox schema only the registry holds is appended; others are left out."""
    by_fingerprint = {s.fingerprint: s for s in schemas}
    skipped = []
    for schema_id, text in sorted(registered.items()):
        try:
            schema = load_schema(text, f"Schema Registry id {schema_id}")
        except PipelineError:
            skipped.append(schema_id)
            continue
        known = by_fingerprint.get(schema.fingerprint, schema)
        by_fingerprint[schema.fingerprint] = dataclasses.replace(known, confluent_ids=known.confluent_ids | {schema_id})
    if skipped:
        log.info("Schema Registry ids %s are not outbox event schemas: not decoded", skipped)
    return list(by_fingerprint.values())


def registry_schemas(registry: RegistryAccess) -> dict[int, str]:
    """id -> schema text of every Avro schema version of every subject in the registry (each id
    fetched once). Raises ServerUnreachableError naming the URL when the registry cannot be read."""
    from confluent_kafka.schema_registry import SchemaRegistryError

    from relay.avro.framing import registry_client

    client = registry_client(registry.url.reveal(), registry.basic_auth.reveal())
    try:
        ids = {
            schema_id
            for subject in client.get_subjects()
            for version in client.get_versions(subject)
            if (schema_id := client.get_version(subject, version).schema_id) is not None
        }
        schemas = {schema_id: client.get_schema(schema_id) for schema_id in sorted(ids)}
    except SchemaRegistryError as exc:  # an answer, but a refusal (credentials, ...)
        raise PipelineError(
            f"the Schema Registry at {registry.url} (RELAY_SCHEMA_REGISTRY_URL) refused to list its schemas: {exc}"
        ) from exc
    except Exception as exc:
        raise ServerUnreachableError(
            f"cannot read the schemas of the Schema Registry at {registry.url} "
            f"(RELAY_SCHEMA_REGISTRY_URL): {type(exc).__name__}: {exc}"
        ) from exc
    return {i: s.schema_str for i, s in schemas.items() if (s.schema_type or "AVRO") == "AVRO" and s.schema_str}

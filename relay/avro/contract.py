"""The Avro contract: which `.avsc` files exist, and the rules every writer schema follows.

Layout of a schema folder (the repository's `schemas/`, installed as `relay_schemas`):

    outbox_event.avsc        io.outboxrelay.v1.OutboxEvent: the generic envelope, payload as
                             relaxed Extended JSON text; used for every event type without a schema
    events/<EventType>.avsc  a typed envelope for one event type (top-level "eventType" attribute)
    history/*.avsc           earlier versions of changed schemas: never written, only read, so
                             readers can still decode messages written before a change

A typed envelope is the generic envelope with the `payload` field's type replaced by a record:
the same fields, in the same order, with the same types (so a reader of any schema can select
the common columns), plus the top-level attribute `"eventType"` naming the event type it is
written for. `envelope_problems()` states these rules; the schema folder
(relay.avro.folder.SchemaFolder) refuses a folder that breaks them (at start) and
`outbox-relay schemas check` reports every problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException, fingerprint, to_parsing_canonical_form

from relay.avro.mapping import UnsupportedSchemaError, check_payload_schema
from relay.core.errors import ConfigError

ENVELOPE = "io.outboxrelay.v1.OutboxEvent"
EVENT_TYPE_ATTRIBUTE = "eventType"
EVENTS_DIR = "events"
HISTORY_DIR = "history"
PAYLOAD_FIELD = "payload"


class SchemaError(ConfigError):
    """Raised when a schema file does not parse or breaks the envelope rules; names the file."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(file, message)
        self.file = file


@dataclass(frozen=True)
class SchemaFile:
    """One `.avsc` file: where it is (relative to the folder), its JSON, and its parsed form."""

    path: str  # POSIX path relative to the schema folder, e.g. "events/OrderCreated.avsc"
    raw: Mapping[str, Any]
    parsed: Any

    @property
    def name(self) -> str:
        return str(self.parsed["name"])

    @property
    def historical(self) -> bool:
        return PurePosixPath(self.path).parts[0] == HISTORY_DIR

    @property
    def event_type(self) -> str | None:
        value = self.raw.get(EVENT_TYPE_ATTRIBUTE)
        return value if isinstance(value, str) else None

    @cached_property
    def canonical(self) -> str:
        return str(to_parsing_canonical_form(self.parsed))

    @cached_property
    def fingerprint(self) -> bytes:
        """CRC-64-AVRO of the parsing canonical form, little-endian (single-object encoding)."""
        return bytes.fromhex(fingerprint(self.canonical, "CRC-64-AVRO"))


def parse_file(path: str, text: str) -> SchemaFile:
    """Parse one schema file's text; raises SchemaError naming `path`."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(path, f"not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise SchemaError(path, "a message schema must be an Avro record")
    try:
        parsed = fastavro.parse_schema(raw)
    except (SchemaParseException, ValueError, KeyError, TypeError) as exc:
        raise SchemaError(path, f"not a valid Avro schema: {exc}") from exc
    return SchemaFile(path, raw, parsed)


def iter_texts(folder: Any) -> Iterator[tuple[str, str]]:
    """(relative POSIX path, text) of every `.avsc` under `folder` (a Path or a Traversable),
    in a stable order: top level, then `events/`, then `history/`."""

    def walk(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
        entries = sorted(node.iterdir(), key=lambda e: e.name)
        for entry in entries:
            if entry.is_file() and entry.name.endswith(".avsc"):
                yield prefix + entry.name, entry.read_text(encoding="utf-8")
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith((".", "_")):
                yield from walk(entry, prefix + entry.name + "/")

    yield from walk(folder, "")


def load_folder(folder: Any) -> list[SchemaFile]:
    """Every schema file under `folder`, parsed; raises SchemaError on the first bad one."""
    return [parse_file(path, text) for path, text in iter_texts(folder)]


def _common_fields(schema: SchemaFile) -> list[tuple[str, str]]:
    return [
        (f["name"], "" if f["name"] == PAYLOAD_FIELD else to_parsing_canonical_form(f["type"]))
        for f in schema.parsed["fields"]
    ]


def envelope_problems(schema: SchemaFile, generic: SchemaFile) -> list[str]:
    """What makes `schema` (a file under events/) not a valid typed envelope; empty if none."""
    problems = []
    if schema.event_type is None or not schema.event_type:
        problems.append(
            f'a typed envelope needs a top-level "{EVENT_TYPE_ATTRIBUTE}" attribute '
            "naming the event type it is written for"
        )
    if _common_fields(schema) != _common_fields(generic):
        expected = ", ".join(name for name, _ in _common_fields(generic))
        problems.append(
            f"its fields must be those of {ENVELOPE} ({expected}), in that order and with "
            "the same types, except payload's type"
        )
        return problems
    payload = next(f for f in schema.parsed["fields"] if f["name"] == PAYLOAD_FIELD)
    ptype = payload["type"]
    if not isinstance(ptype, dict) or ptype.get("type") != "record":
        problems.append("its payload field must be a record")
        return problems
    try:
        check_payload_schema(ptype, schema.parsed.get("__named_schemas", {}))
    except UnsupportedSchemaError as exc:
        problems.append(f"field {exc.path!r}: {exc.reason}")
    return problems


@dataclass(frozen=True)
class Contract:
    """A checked schema folder: the generic envelope, typed envelopes by event type, history."""

    generic: SchemaFile
    typed: Mapping[str, SchemaFile]
    all: list[SchemaFile]


def problems_of(files: list[SchemaFile]) -> list[tuple[str, str]]:
    """Every rule broken by a folder's files, as (file, problem) pairs."""
    out: list[tuple[str, str]] = []
    current = [f for f in files if not f.historical]
    generics = [f for f in current if f.name == ENVELOPE]
    if not generics:
        return [("", f"no schema named {ENVELOPE} (the generic envelope)")]
    generic = generics[0]
    names: dict[str, str] = {}
    event_types: dict[str, str] = {}
    for f in current:
        if f.name in names:
            out.append((f.path, f"record name {f.name} is also used by {names[f.name]}"))
        names.setdefault(f.name, f.path)
        in_events = PurePosixPath(f.path).parts[0] == EVENTS_DIR
        if f is generic:
            continue
        if not in_events:
            out.append(
                (f.path, f"only {ENVELOPE} lives at the top level; typed envelopes go in {EVENTS_DIR}/<EventType>.avsc")
            )
            continue
        out.extend((f.path, p) for p in envelope_problems(f, generic))
        if f.event_type:
            if f.event_type in event_types:
                out.append((f.path, f"event type {f.event_type!r} already has a schema: {event_types[f.event_type]}"))
            event_types.setdefault(f.event_type, f.path)
    return out


def contract_of(files: list[SchemaFile]) -> Contract:
    """The contract of a folder's files; raises SchemaError naming the first broken rule."""
    problems = problems_of(files)
    if problems:
        file, problem = problems[0]
        raise SchemaError(file or "schemas", problem)
    current = [f for f in files if not f.historical]
    generic = next(f for f in current if f.name == ENVELOPE)
    typed = {f.event_type: f for f in current if f is not generic and f.event_type}
    return Contract(generic, typed, files)


def history_file_name(schema: SchemaFile) -> str:
    """Where an earlier version of `schema` is kept: history/<full name>.<fingerprint>.avsc."""
    return f"{HISTORY_DIR}/{schema.name}.{schema.fingerprint.hex()}.avsc"

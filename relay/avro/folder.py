"""The schema folder: every writer schema by full name, by fingerprint and by event type.

This is the local folder (`schemas/`, installed as the `relay_schemas` package), not a Schema
Registry server: for that, see relay.avro.framing and confluent-kafka's `SchemaRegistryClient`.
With single-object encoding the folder is the registry: readers find the writer schema of a
value by the fingerprint it carries (`SchemaFolder.bundled().decode(value)`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import fastavro

from relay.avro.contract import PAYLOAD_FIELD, SchemaError, SchemaFile, contract_of, load_folder, parse_file
from relay.avro.mapping import PayloadMapper
from relay.avro.wire import SINGLE_OBJECT_MAGIC


@dataclass(frozen=True)
class WriterSchema:
    """The schema an event type is written with; `mapper` converts a typed payload (None: generic),
    whose type (fastavro-parsed) and the named types it may refer to are `payload` and `named`."""

    name: str
    path: str
    mapper: PayloadMapper | None
    payload: Any = None
    named: Mapping[str, Any] = field(default_factory=dict)


class SchemaFolder:
    """The writer schemas of a schema folder, by full name, by fingerprint and by event type.

    This is the local folder (`schemas/`), not a Schema Registry server: for that, see
    `relay.avro.framing` and confluent-kafka's `SchemaRegistryClient`. (Until 0.2 this class was
    called `SchemaRegistry`; that name stays as an alias for one release.)

    Construction checks the folder against the contract (`relay.avro.contract`) and raises
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
            payload = next(x for x in f.parsed["fields"] if x["name"] == PAYLOAD_FIELD)["type"]
            named = f.parsed["__named_schemas"]
            try:
                mapper = PayloadMapper(payload, named)
            except ValueError as exc:
                raise SchemaError(f.path, str(exc)) from exc
            writers[event_type] = WriterSchema(f.name, f.path, mapper, payload, named)
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

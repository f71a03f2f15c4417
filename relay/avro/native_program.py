"""A typed payload schema compiled for the compiled encoder (relay._native, native/src/typed.rs).

The compiled encoder writes a typed payload straight from its raw BSON by the mapping of
relay.avro.mapping. It receives the payload's (fastavro-parsed) schema as a flat list of nodes,
records referring to their fields, and to themselves, by index:

    (kind, a, b, children, names, extra)

| kind                        | a          | b     | children      | names       | extra                              |
| --------------------------- | ---------- | ----- | ------------- | ----------- | ---------------------------------- |
| null boolean int long float double bytes string uuid timestamp-millis timestamp-micros date | | | | | |
| enum                        |            |       |               | the symbols |                                    |
| fixed                       | size       |       |               |             |                                    |
| array, map                  |            |       | [item]        |             |                                    |
| record                      |            |       | field nodes   | field names | per field when absent: see below   |
| union                       | null index |       | branch nodes  |             | the index fastavro writes, or -1   |
| decimal                     | precision  | scale |               |             | [fixed size, or -1 on bytes]       |
| declined                    |            |       |               |             |                                    |

A record field the payload lacks: `-1` refuses it (required), `k >= 0` writes union branch `k`
(null: the field is nullable without a default, or its default is null), `-2` leaves the event
to the Python path (fastavro writes another default). A union branch is written with the index
of the first branch of its name (fastavro's rule for the Python path's `(name, value)` datums;
the bytes are the same: `long` and `timestamp-millis` both write a long, `string` and `uuid` a
string); a decimal branch after a plain `bytes` gets `-1` (fastavro refuses a Decimal there),
which leaves the event to the Python path. `declined` marks a type the compiled encoder leaves to the
Python path whatever the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relay.avro.mapping import SUPPORTED_LOGICAL, branch_name

Node = tuple[str, int, int, list[int], list[str], list[int]]

REFUSE, DECLINE = -1, -2
# Leaves of the mapping with nothing to configure: the node is just the kind.
LEAVES = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
    | {logical for _, logical in SUPPORTED_LOGICAL if logical != "decimal"}
)


class _Compiler:
    def __init__(self, named: Mapping[str, Any]) -> None:
        self.named = named
        self.nodes: list[Node] = []
        self.records: dict[str, int] = {}

    def add(self, kind: str, a: int = 0, b: int = 0, children: list[int] | None = None,
            names: list[str] | None = None, extra: list[int] | None = None) -> int:  # fmt: skip
        self.nodes.append((kind, a, b, children or [], names or [], extra or []))
        return len(self.nodes) - 1

    def compile(self, schema: Any) -> int:
        if isinstance(schema, list):
            return self.union(schema)
        if isinstance(schema, str):
            if schema in LEAVES:
                return self.add(schema)
            if schema in self.records:
                return self.records[schema]
            return self.compile(self.named[schema])
        kind = schema["type"]
        logical = schema.get("logicalType")
        if logical == "decimal":
            size = int(schema["size"]) if kind == "fixed" else -1
            return self.add("decimal", int(schema["precision"]), int(schema.get("scale", 0)), extra=[size])
        if logical is not None:
            return self.add(logical)
        if kind in LEAVES:
            return self.add(kind)
        if kind == "record":
            return self.record(schema)
        if kind == "enum":
            return self.add("enum", names=list(schema["symbols"]))
        if kind == "fixed":
            return self.add("fixed", int(schema["size"]))
        if kind == "array":
            return self.add("array", children=[self.compile(schema["items"])])
        if kind == "map":
            return self.add("map", children=[self.compile(schema["values"])])
        return self.add("declined")

    def record(self, schema: Mapping[str, Any]) -> int:
        index = self.add("record")  # registered first: a record may refer to itself
        self.records[str(schema["name"])] = index
        names, children, absent = [], [], []
        for field in schema["fields"]:
            ftype = field["type"]
            null_index = ftype.index("null") if isinstance(ftype, list) and "null" in ftype else None
            if "default" in field:
                absent.append(null_index if field["default"] is None and null_index is not None else DECLINE)
            else:
                absent.append(REFUSE if null_index is None else null_index)
            names.append(str(field["name"]))
            children.append(self.compile(ftype))
        self.nodes[index] = ("record", 0, 0, children, names, absent)
        return index

    def union(self, branches: list[Any]) -> int:
        null = branches.index("null") if "null" in branches else -1
        names = [branch_name(b) for b in branches]
        children, write = [], []
        for i, branch in enumerate(branches):
            if branch == "null":
                continue
            children.append(self.compile(branch))
            first = names.index(names[i])
            # fastavro writes the datum with the first branch of its name: the same bytes, but
            # for a Decimal under a plain `bytes` (fastavro refuses it; the Python path reports it).
            decimal = isinstance(branch, dict) and branch.get("logicalType") == "decimal"
            write.append(REFUSE if decimal and first != i else first)
        return self.add("union", null, children=children, extra=write)


def native_program(schema: Any, named: Mapping[str, Any]) -> tuple[int, list[Node]]:
    """The payload schema (fastavro-parsed, with its named types) as the compiled encoder's
    (root index, nodes)."""
    compiler = _Compiler(named)
    root = compiler.compile(schema)
    return root, compiler.nodes

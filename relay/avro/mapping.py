"""The BSON -> Avro mapping for typed payloads: one rule per (BSON type, declared Avro type).

A typed event's payload document is converted to the Avro datum its schema declares before it
is encoded. The mapping is deterministic (the same BSON value and schema always give the same
Avro value) and exact (nothing is rounded, truncated or dropped): a value that has no exact
mapping raises `UnmappableValueError` naming the field path, e.g. `payload.lines[2].price`,
which the message builder turns into a poison event.

| BSON type        | Avro type declared in the schema         | Avro value                                  |
| ---------------- | ---------------------------------------- | ------------------------------------------- |
| null             | `"null"` (a union branch)                | null                                        |
| boolean          | `boolean`                                | the boolean                                 |
| int32            | `int`, `long`, `double`, `float`, decimal | the number (float/double only if exact)    |
| int64            | `long`; `int` if it fits; `double`/`float` if exact; decimal | the number              |
| double           | `double`; `float` if exact in 32 bits    | the number (NaN and infinities included)    |
| Decimal128       | decimal (on `bytes` or `fixed`)          | exact; at most `scale` places and `precision` digits; no NaN/Infinity |
| string           | `string`; `enum` (a declared symbol); uuid (`string`) | the text; a uuid in canonical form |
| ObjectId         | `string`; `fixed` of size 12             | 24 lowercase hex digits; the 12 bytes       |
| date             | timestamp-millis, timestamp-micros (`long`); date (`int`, midnight UTC only) | the instant; years 1-9999 only |
| binary, subtype 4| uuid (`string`); `bytes`; `fixed` of size 16 | canonical UUID text; the 16 bytes       |
| binary, other    | `bytes`; `fixed` of the same size         | the data bytes (the subtype is not carried) |
| document         | `record` (fields by name); `map`         | see below                                   |
| array            | `array`                                  | each item by the item type                  |
| anything else    | (none: regex, JavaScript, timestamp, min/max key, DBRef, DBPointer) | poison |

Records: a document field missing from the payload takes the field's default, else null when
the field's type is a union with null, else it is an error; a payload field the record does not
declare is an error (adding it to the schema first, as an optional field, is the way to evolve).
Unions: `null` takes the null branch; any other value takes the first branch, in schema order,
that accepts it. Dates outside years 1-9999 are refused because most Avro readers (Python,
Spark, Java's `LocalDate` for `date`) cannot hold them.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from bson import Binary, Code, Decimal128, ObjectId
from bson.datetime_ms import DatetimeMS
from bson.int64 import Int64

Converter = Callable[[Any], Any]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_INT32 = (-(2**31), 2**31 - 1)
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# Avro logical types a BSON value maps to, by underlying type.
SUPPORTED_LOGICAL = {
    ("bytes", "decimal"),
    ("fixed", "decimal"),
    ("string", "uuid"),
    ("long", "timestamp-millis"),
    ("long", "timestamp-micros"),
    ("int", "date"),
}
UUID_SUBTYPE = 4
LEGACY_UUID_SUBTYPE = 3


class UnmappableValueError(ValueError):
    """Raised when a payload value has no exact mapping to its declared Avro type."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"field {path!r} {reason}")
        self.path = path
        self.reason = reason


class UnsupportedSchemaError(ValueError):
    """Raised when a payload schema declares an Avro type no BSON value maps to."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"field {path!r}: {reason}")
        self.path = path
        self.reason = reason


class _Mismatch(Exception):
    """Internal: a value did not map; `segments` grows as the error unwinds to the root."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.segments: list[str] = []


def bson_type_name(value: Any) -> str:
    """The BSON type name of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, Int64):
        return "int64"
    if isinstance(value, int):
        return "int32"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Code):
        return "javascript"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Binary):
        return f"binary (subtype {value.subtype})"
    if isinstance(value, bytes):
        return "binary (subtype 0)"
    if isinstance(value, (dt.datetime, DatetimeMS)):
        return "date"
    if isinstance(value, Mapping):
        return "document"
    if isinstance(value, list):
        return "array"
    return {
        "ObjectId": "objectId",
        "Decimal128": "decimal128",
        "Regex": "regex",
        "Timestamp": "timestamp",
        "MinKey": "minKey",
        "MaxKey": "maxKey",
        "DBRef": "dbPointer/DBRef",
    }.get(type(value).__name__, type(value).__name__)


def _type_label(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union [" + ", ".join(_type_label(s) for s in schema) + "]"
    logical = schema.get("logicalType")
    if logical == "decimal":
        return f"decimal({schema.get('precision')},{schema.get('scale', 0)})"
    if logical:
        return str(logical)
    if schema["type"] in ("record", "enum", "fixed"):
        return f"{schema['type']} {schema['name']}"
    return str(schema["type"])


def _refuse(value: Any, schema: Any) -> _Mismatch:
    return _Mismatch(f"holds {bson_type_name(value)}, which does not map to Avro {_type_label(schema)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _millis(value: Any) -> int:
    if isinstance(value, DatetimeMS):
        raise _Mismatch(
            f"holds a date ({int(value)} ms since 1970) outside years 1-9999, which Avro readers cannot represent"
        )
    moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return int((moment - _EPOCH) // dt.timedelta(milliseconds=1))


class PayloadMapper:
    """Compiles an Avro payload schema (fastavro-parsed) into a BSON -> Avro converter.

    `convert(document)` returns the datum for fastavro's writer or raises
    `UnmappableValueError` naming the field path under `root` (default `payload`).
    Construction raises `UnsupportedSchemaError` when the schema declares a type no BSON
    value maps to (e.g. `time-millis`), so a bad schema fails at start, not per event.
    """

    def __init__(self, schema: Any, named: Mapping[str, Any], root: str = "payload") -> None:
        self._named = named
        self._root = root
        self._compiled: dict[str, Converter] = {}
        self._convert = self._compile(schema, [root])

    def convert(self, value: Any) -> Any:
        try:
            return self._convert(value)
        except _Mismatch as exc:
            raise UnmappableValueError(self._root + "".join(reversed(exc.segments)), exc.reason) from exc

    # ---- compilation ------------------------------------------------------------------------

    def _compile(self, schema: Any, path: list[str]) -> Converter:
        if isinstance(schema, list):
            return self._union(schema, path)
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVE[schema]
            return self._named_ref(schema, path)
        kind = schema["type"]
        logical = schema.get("logicalType")
        if logical is not None:
            if (kind, logical) not in SUPPORTED_LOGICAL:
                raise UnsupportedSchemaError("".join(path), f"logical type {logical!r} on {kind} has no BSON mapping")
            return self._logical(schema, kind, logical)
        if kind in _PRIMITIVES:
            return _PRIMITIVE[kind]
        if kind == "record":
            return self._record(schema, path)
        if kind == "enum":
            return _enum(schema)
        if kind == "fixed":
            return _fixed(schema)
        if kind == "array":
            return _array(self._compile(schema["items"], [*path, "[]"]))
        if kind == "map":
            return _map(self._compile(schema["values"], [*path, "{}"]))
        raise UnsupportedSchemaError("".join(path), f"Avro type {kind!r} has no BSON mapping")

    def _named_ref(self, name: str, path: list[str]) -> Converter:
        if name in self._compiled:
            return self._compiled[name]
        if name not in self._named:
            raise UnsupportedSchemaError("".join(path), f"unknown named type {name!r}")
        return self._compile(self._named[name], path)

    def _record(self, schema: Mapping[str, Any], path: list[str]) -> Converter:
        name = schema["name"]
        fields: list[tuple[str, Converter, bool, bool]] = []

        def convert(doc: Any) -> dict[str, Any]:
            if not isinstance(doc, Mapping):
                raise _refuse(doc, schema)
            out: dict[str, Any] = {}
            present = 0
            for fname, conv, has_default, nullable in fields:
                if fname in doc:
                    present += 1
                    try:
                        out[fname] = conv(doc[fname])
                    except _Mismatch as exc:
                        exc.segments.append("." + fname)
                        raise
                elif has_default:
                    continue  # fastavro writes the declared default
                elif nullable:
                    out[fname] = None
                else:
                    missing = _Mismatch(f"is missing; record {name} requires it (it has no default)")
                    missing.segments.append("." + fname)
                    raise missing
            if present != len(doc):
                extra = next(k for k in doc if k not in known)
                undeclared = _Mismatch(
                    f"is not declared in record {name}; add it to the schema (as an optional field) before writing it"
                )
                undeclared.segments.append("." + str(extra))
                raise undeclared
            return out

        # Register before compiling the fields: a record may refer to itself.
        self._compiled[name] = convert
        for f in schema["fields"]:
            ftype = f["type"]
            nullable = isinstance(ftype, list) and "null" in ftype
            fields.append((f["name"], self._compile(ftype, [*path, "." + f["name"]]), "default" in f, nullable))
        known = frozenset(f[0] for f in fields)
        return convert

    def _union(self, branches: list[Any], path: list[str]) -> Converter:
        has_null = "null" in branches
        others = [b for b in branches if b != "null"]
        compiled = [(branch_name(b), self._compile(b, path)) for b in others]
        if len(compiled) == 1:
            ((_, only),) = compiled

            def one(value: Any) -> Any:
                if value is None:
                    if has_null:
                        return None
                    raise _Mismatch("is null, but its union has no null branch")
                return only(value)

            return one

        label = _type_label(branches)

        def first_match(value: Any) -> Any:
            if value is None:
                if has_null:
                    return None
                raise _Mismatch(f"is null, but {label} has no null branch")
            for name, conv in compiled:
                try:
                    # Tuple notation makes fastavro write exactly the branch chosen here.
                    return (name, conv(value))
                except _Mismatch:
                    continue
            raise _Mismatch(f"holds {bson_type_name(value)}, which matches no branch of {label}")

        return first_match

    def _logical(self, schema: Mapping[str, Any], kind: str, logical: str) -> Converter:
        if logical == "decimal":
            return _decimal(schema, kind)
        if logical == "uuid":
            return _uuid
        if logical == "timestamp-millis":
            return _timestamp_millis
        if logical == "timestamp-micros":
            return _timestamp_micros
        return _date


def branch_name(schema: Any) -> str:
    """The name a union branch goes by, as fastavro matches a `(name, value)` datum to a branch
    (its `write_union`): a named type's full name, else the type (a reference to a named type is
    its full name). fastavro writes such a datum with the first branch of that name."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict) and schema["type"] in ("record", "enum", "fixed"):
        return str(schema["name"])
    return str(schema["type"])


# ---- leaf converters -------------------------------------------------------------------------


def _null(value: Any) -> None:
    if value is not None:
        raise _refuse(value, "null")


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _refuse(value, "boolean")


def _int(value: Any) -> int:
    if _is_int(value):
        if _INT32[0] <= value <= _INT32[1]:
            return int(value)
        raise _Mismatch(f"holds {value}, outside Avro int's 32-bit range; declare it long")
    raise _refuse(value, "int")


def _long(value: Any) -> int:
    if _is_int(value):
        return int(value)
    raise _refuse(value, "long")


def _double(value: Any) -> float:
    if isinstance(value, float):
        return value
    if _is_int(value):
        as_float = float(value)
        if int(as_float) != value:
            raise _Mismatch(f"holds {value}, which Avro double cannot hold exactly")
        return as_float
    raise _refuse(value, "double")


def _float(value: Any) -> float:
    try:
        as_float = _double(value)
    except _Mismatch as exc:
        raise _Mismatch(exc.reason.replace("Avro double", "Avro float")) from exc
    try:
        exact = not math.isfinite(as_float) or struct.unpack("f", struct.pack("f", as_float))[0] == as_float
    except OverflowError:  # beyond a 32-bit float's range
        exact = False
    if not exact:
        raise _Mismatch(f"holds {value!r}, which a 32-bit Avro float cannot hold exactly; declare it double")
    return as_float


def _string(value: Any) -> str:
    if type(value) is str:  # not bson.Code, a str subclass
        return value
    if isinstance(value, ObjectId):
        return str(value)
    raise _refuse(value, "string")


def _binary_data(value: Any, label: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise _refuse(value, label)


def _bytes(value: Any) -> bytes:
    return _binary_data(value, "bytes")


_PRIMITIVE: dict[str, Converter] = {
    "null": _null,
    "boolean": _boolean,
    "int": _int,
    "long": _long,
    "float": _float,
    "double": _double,
    "bytes": _bytes,
    "string": _string,
}


def _enum(schema: Mapping[str, Any]) -> Converter:
    symbols = frozenset(schema["symbols"])

    def convert(value: Any) -> str:
        if type(value) is not str:
            raise _refuse(value, schema)
        if value not in symbols:
            raise _Mismatch(f"holds {value!r}, not a symbol of enum {schema['name']} ({', '.join(schema['symbols'])})")
        return value

    return convert


def _fixed(schema: Mapping[str, Any]) -> Converter:
    size = int(schema["size"])

    def convert(value: Any) -> bytes:
        data = value.binary if isinstance(value, ObjectId) else _binary_data(value, schema)
        if len(data) != size:
            raise _Mismatch(f"holds {len(data)} bytes; fixed {schema['name']} has size {size}")
        return data

    return convert


def _array(item: Converter) -> Converter:
    def convert(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _refuse(value, "array")
        out = []
        for i, v in enumerate(value):
            try:
                out.append(item(v))
            except _Mismatch as exc:
                exc.segments.append(f"[{i}]")
                raise
        return out

    return convert


def _map(values: Converter) -> Converter:
    def convert(value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise _refuse(value, "map")
        out = {}
        for k, v in value.items():
            try:
                out[k] = values(v)
            except _Mismatch as exc:
                exc.segments.append(f"[{k!r}]")
                raise
        return out

    return convert


def _decimal(schema: Mapping[str, Any], kind: str) -> Converter:
    precision = int(schema["precision"])
    scale = int(schema.get("scale", 0))
    label = f"decimal({precision},{scale})"
    size = int(schema["size"]) if kind == "fixed" else None

    def convert(value: Any) -> Decimal:
        if isinstance(value, Decimal128):
            number = value.to_decimal()
        elif _is_int(value):
            number = Decimal(int(value))
        else:
            raise _refuse(value, schema)
        if not number.is_finite():
            raise _Mismatch(f"holds Decimal128 {number}, which Avro {label} cannot represent")
        # Integer arithmetic only: Decimal's default context would round past 28 digits.
        sign, digits, exponent = number.as_tuple()
        assert isinstance(exponent, int)
        coefficient = int("".join(map(str, digits)))
        shift = exponent + scale
        if shift >= 0:
            unscaled = coefficient * 10**shift
        else:
            unscaled, rest = divmod(coefficient, 10**-shift)
            if rest:
                raise _Mismatch(
                    f"holds {number}, more than the {scale} decimal places of {label} (the relay does not round)"
                )
        text = str(unscaled)
        if len(text) > precision:
            raise _Mismatch(f"holds {number}, more than the {precision} digits of {label}")
        if size is not None and unscaled.bit_length() >= 8 * size:
            raise _Mismatch(f"holds {number}, too large for {label} in fixed({size})")
        negative = 1 if sign and unscaled else 0
        return Decimal((negative, tuple(int(c) for c in text), -scale))

    return convert


def _uuid(value: Any) -> str:
    if isinstance(value, Binary) and value.subtype == UUID_SUBTYPE and len(value) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    if isinstance(value, Binary) and value.subtype == LEGACY_UUID_SUBTYPE:
        raise _Mismatch(
            "holds a legacy UUID (binary subtype 3), whose byte order depends on the "
            "driver that wrote it; write UUIDs as binary subtype 4"
        )
    if isinstance(value, uuid.UUID):
        return str(value)
    if type(value) is str:
        try:
            return str(uuid.UUID(value))
        except ValueError as exc:
            raise _Mismatch(f"holds {value!r}, which is not a UUID") from exc
    raise _refuse(value, "uuid")


def _check_date(value: Any) -> None:
    if not isinstance(value, (dt.datetime, DatetimeMS)):
        raise _Mismatch(f"holds {bson_type_name(value)}, which does not map to an Avro timestamp or date")


def _timestamp_millis(value: Any) -> int:
    _check_date(value)
    return _millis(value)


def _timestamp_micros(value: Any) -> int:
    _check_date(value)
    return _millis(value) * 1000


def _date(value: Any) -> int:
    _check_date(value)
    millis = _millis(value)
    days, rest = divmod(millis, 86_400_000)
    if rest:
        raise _Mismatch(
            "holds a date that is not midnight UTC; Avro date holds days only "
            "(declare timestamp-millis to keep the time)"
        )
    return days


def check_payload_schema(schema: Any, named: Mapping[str, Any], root: str = "payload") -> None:
    """Raise UnsupportedSchemaError if some type in `schema` has no BSON mapping."""
    PayloadMapper(schema, named, root)

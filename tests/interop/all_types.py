"""The AllTypes test schema (tests/interop/schemas/events/AllTypes.avsc): payloads holding every
BSON type a payload can hold, with the normalized value every Avro reader must decode
(see bson_cases), shared by the Java and Spark interop tests."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

from bson import Binary, Decimal128, ObjectId
from bson.int64 import Int64

from relay.avro.folder import SchemaFolder
from relay.core.change import Change
from tests.changes import change_value
from tests.interop.bson_cases import n_bytes, n_decimal, n_double, n_ts

HERE = Path(__file__).resolve().parent
ALL_TYPES = HERE / "schemas" / "events" / "AllTypes.avsc"
UTC = dt.UTC
TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}


def registry_with_all_types() -> SchemaFolder:
    """The bundled schemas plus the AllTypes typed envelope."""
    registry = SchemaFolder.bundled()
    registry.add(json.loads(ALL_TYPES.read_text()))
    return registry


def change_for(doc: dict[str, Any]) -> Change:
    """The change of the insert of `doc`, as the change source hands it over."""
    return change_value(doc, TOKEN)


UID = uuid.UUID("5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b")


def all_types_documents() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(payload document, normalized value readers must decode) for the AllTypes schema."""
    oid = ObjectId("65f0c0ffee0000000000abcd")
    first = {
        "objectIdText": oid, "objectIdBytes": oid,
        "amount": Decimal128("-9999999999999999999999999999.9999"),
        "price": Decimal128("12.5"),
        "createdAt": dt.datetime(1969, 7, 20, 20, 17, 40, 123000, UTC),
        "preciseAt": dt.datetime(1, 1, 1, tzinfo=UTC),
        "birthday": dt.datetime(1912, 6, 23, tzinfo=UTC),
        "smallest": Int64(-(2**63)), "largest": Int64(2**63 - 1),
        "count": -(2**31), "widened": 2**31 - 1,
        "ratio": -0.0, "half": 0.5, "flag": True, "name": "Zoë 😀 \u0000 end",
        "status": "NEW",
        "blob": b"\x00\x01\xfe\xff", "oldBinary": Binary(b"legacy", 2), "digest": Binary(bytes(range(16)), 5),
        "custom": Binary(b"\x80user", 128), "uuid": Binary(UID.bytes, 4),
        "note": None, "choice": Int64(-1),
        "customer": {"id": "c-1", "address": {"city": "Zürich", "zip": None}},
        "lines": [{"sku": "a", "qty": 1, "price": Decimal128("0.01")},
                  {"sku": "b", "qty": 2**31 - 1, "price": Decimal128("9999999.99")}],
        "tags": [], "matrix": [[Int64(-(2**63)), Int64(2**63 - 1)], []],
        "attributes": {"a.b": "dotted", "": "empty key"},
    }
    first_expected = {
        "objectIdText": "65f0c0ffee0000000000abcd", "objectIdBytes": n_bytes(oid.binary),
        "amount": n_decimal(-99999999999999999999999999999999, 4), "price": n_decimal(1250, 2),
        "createdAt": n_ts(first["createdAt"]), "preciseAt": ("ts_us", -62135596800000000),
        "birthday": ("date", "1912-06-23"),
        "smallest": -(2**63), "largest": 2**63 - 1, "count": -(2**31), "widened": 2**31 - 1,
        "ratio": n_double(-0.0), "half": n_double(0.5), "flag": True, "name": "Zoë 😀 \u0000 end",
        "status": "NEW", "blob": n_bytes(b"\x00\x01\xfe\xff"), "oldBinary": n_bytes(b"legacy"),
        "digest": n_bytes(bytes(range(16))), "custom": n_bytes(b"\x80user"), "uuid": ("uuid", str(UID)),
        "note": None, "absent": None, "choice": -1,
        "customer": {"id": "c-1", "address": {"city": "Zürich", "zip": None}},
        "lines": [{"sku": "a", "qty": 1, "price": n_decimal(1, 2)},
                  {"sku": "b", "qty": 2**31 - 1, "price": n_decimal(999999999, 2)}],
        "tags": [], "matrix": [[-(2**63), 2**63 - 1], []],
        "attributes": {"a.b": "dotted", "": "empty key"},
    }
    second = dict(first, **{
        "amount": Decimal128("0"), "price": 7,
        "createdAt": dt.datetime(9999, 12, 31, 23, 59, 59, 999000, UTC),
        "preciseAt": dt.datetime(1969, 12, 31, 23, 59, 59, 999000, UTC),
        "birthday": dt.datetime(1970, 1, 1, tzinfo=UTC),
        "ratio": float("nan"), "half": float("-inf"), "flag": False, "status": "SHIPPED",
        "note": "present", "choice": "text", "tags": ["x", "y"],
        "customer": {"id": "c-2", "address": {"city": "Oslo", "zip": "0150"}},
    })
    second_expected = dict(first_expected, **{
        "amount": n_decimal(0, 4), "price": n_decimal(700, 2),
        "createdAt": n_ts(second["createdAt"]), "preciseAt": ("ts_us", -1000),
        "birthday": ("date", "1970-01-01"), "ratio": n_double(float("nan")), "half": n_double(float("-inf")),
        "flag": False, "status": "SHIPPED", "note": "present", "choice": "text", "tags": ["x", "y"],
        "customer": {"id": "c-2", "address": {"city": "Oslo", "zip": "0150"}},
    })
    return [(first, first_expected), (second, second_expected)]


def generic_payload() -> dict[str, Any]:
    """Every BSON type in a payload with no schema (the generic envelope)."""
    return {
        "oid": ObjectId("65f0c0ffee0000000000abcd"), "dec": Decimal128("-15E-6176"), "nan": Decimal128("NaN"),
        "before1970": dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=UTC), "min": Int64(-(2**63)),
        "max": Int64(2**63 - 1), "int": -(2**31), "double": 1e308, "bin": b"\x00\xff",
        "uuid": Binary(UID.bytes, 4), "user": Binary(b"x", 128), "nested": {"a": [1, {"b": None}]},
        "array": [[], [True, "s"]], "null": None,
    }

"""The BSON -> Avro mapping (relay.avro.mapping): each row of the table, and each value that has no
exact mapping refused with the field path."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from bson import Binary, Code, Decimal128, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from bson.int64 import Int64

from relay.avro.mapping import PayloadMapper, UnmappableValueError, UnsupportedSchemaError

UTC = dt.UTC
OID = ObjectId("65f0c0ffee00000000000001")
UID = uuid.UUID("0f0e0d0c-0b0a-0908-0706-050403020100")


def mapper(field_type: Any) -> PayloadMapper:
    parsed = fastavro.parse_schema({"type": "record", "name": "P", "namespace": "t",
                                    "fields": [{"name": "v", "type": field_type}]})
    return PayloadMapper(parsed, parsed["__named_schemas"])


def convert(field_type: Any, value: Any) -> Any:
    return mapper(field_type).convert({"v": value})["v"]


DEC = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}


@pytest.mark.parametrize("field_type, value, expected", [
    ("null", None, None),
    ("boolean", True, True),
    ("int", -(2**31), -(2**31)),
    ("int", Int64(7), 7),
    ("long", Int64(-(2**63)), -(2**63)),
    ("long", Int64(2**63 - 1), 2**63 - 1),
    ("long", 5, 5),
    ("double", 2.5, 2.5),
    ("double", Int64(2**53), float(2**53)),
    ("float", 0.5, 0.5),
    ("string", "zürich", "zürich"),
    ("string", OID, "65f0c0ffee00000000000001"),
    ({"type": "fixed", "name": "ObjectId", "size": 12}, OID, OID.binary),
    (DEC, Decimal128("12.5"), Decimal("12.50")),
    (DEC, Decimal128("-0.01"), Decimal("-0.01")),
    (DEC, Decimal128("12.500"), Decimal("12.50")),  # trailing zeros beyond the scale are exact
    (DEC, Decimal128("1E+3"), Decimal("1000.00")),
    (DEC, 42, Decimal("42.00")),
    ({"type": "bytes", "logicalType": "decimal", "precision": 34, "scale": 0},
     Decimal128("9999999999999999999999999999999999"), Decimal("9999999999999999999999999999999999")),
    ({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4},
     Decimal128("-12345678901234.5678"), Decimal("-12345678901234.5678")),
    ({"type": "long", "logicalType": "timestamp-millis"}, dt.datetime(1969, 7, 20, 20, 17, 40, 1000, UTC),
     -14182939999),
    ({"type": "long", "logicalType": "timestamp-millis"}, dt.datetime(1969, 12, 31, 23, 59, 59, 999000, UTC), -1),
    ({"type": "long", "logicalType": "timestamp-millis"}, dt.datetime(1, 1, 1, tzinfo=UTC), -62135596800000),
    ({"type": "long", "logicalType": "timestamp-micros"}, dt.datetime(1960, 1, 1, 0, 0, 0, 5000, UTC),
     -315619199995000),
    ({"type": "int", "logicalType": "date"}, dt.datetime(1969, 12, 31, tzinfo=UTC), -1),
    ({"type": "string", "logicalType": "uuid"}, Binary(UID.bytes, 4), str(UID)),
    ({"type": "string", "logicalType": "uuid"}, "0F0E0D0C0B0A09080706050403020100", str(UID)),
    ("bytes", b"\x00\xff", b"\x00\xff"),
    ("bytes", Binary(b"\x01\x02", 128), b"\x01\x02"),
    ("bytes", Binary(b"\x01" * 16, 5), b"\x01" * 16),
    ({"type": "fixed", "name": "Md5", "size": 16}, Binary(b"\x07" * 16, 5), b"\x07" * 16),
    ({"type": "enum", "name": "S", "symbols": ["NEW", "PAID"]}, "PAID", "PAID"),
    ({"type": "array", "items": "long"}, [1, Int64(2)], [1, 2]),
    ({"type": "map", "values": "string"}, {"a.b": "x"}, {"a.b": "x"}),
    ({"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}]}, {"x": 1}, {"x": 1}),
    (["null", "string"], None, None),
    (["null", "long", "string"], Int64(3), ("long", 3)),
    (["null", "long", "string"], "three", ("string", "three")),
    (["null", "double", "long"], 3, ("double", 3.0)),  # first branch, in schema order, that accepts it
])
def test_each_bson_type_maps_to_its_declared_avro_type(field_type, value, expected):
    assert convert(field_type, value) == expected


def test_missing_fields_take_the_default_or_null_and_nested_documents_become_records():
    schema = {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"},
        {"name": "nick", "type": ["null", "string"]},
        {"name": "tier", "type": "string", "default": "basic"},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "city", "type": "string"}]}},
    ]}
    got = convert(schema, {"name": "Ada", "address": {"city": "London"}})
    assert got == {"name": "Ada", "nick": None, "address": {"city": "London"}}  # tier: fastavro writes the default


def test_recursive_records_are_mapped():
    tree = {"type": "record", "name": "Node", "fields": [
        {"name": "label", "type": "string"},
        {"name": "children", "type": {"type": "array", "items": "Node"}}]}
    value = {"label": "a", "children": [{"label": "b", "children": []}]}
    assert convert(tree, value) == value


LINES = {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
    {"name": "sku", "type": "string"},
    {"name": "price", "type": DEC}]}}


@pytest.mark.parametrize("field_type, value, path, fragment", [
    ("int", Int64(2**31), "payload.v", "outside Avro int's 32-bit range"),
    ("long", "12", "payload.v", "holds string, which does not map to Avro long"),
    ("long", 1.0, "payload.v", "holds double"),
    ("long", True, "payload.v", "holds boolean"),
    ("double", Int64(2**53 + 1), "payload.v", "cannot hold exactly"),
    ("float", 0.1, "payload.v", "32-bit Avro float cannot hold exactly"),
    ("float", 1e300, "payload.v", "32-bit Avro float cannot hold exactly"),  # beyond its range, not an OverflowError
    ("string", None, "payload.v", "holds null"),
    (DEC, Decimal128("12.345"), "payload.v", "more than the 2 decimal places of decimal(10,2)"),
    (DEC, Decimal128("123456789.01"), "payload.v", "more than the 10 digits"),
    (DEC, Decimal128("NaN"), "payload.v", "cannot represent"),
    (DEC, Decimal128("-Infinity"), "payload.v", "cannot represent"),
    (DEC, 12.5, "payload.v", "holds double"),
    ({"type": "long", "logicalType": "timestamp-millis"}, DatetimeMS(2**62), "payload.v", "outside years 1-9999"),
    ({"type": "int", "logicalType": "date"}, dt.datetime(2024, 1, 1, 12, tzinfo=UTC), "payload.v", "not midnight UTC"),
    ({"type": "string", "logicalType": "uuid"}, Binary(UID.bytes, 3), "payload.v", "legacy UUID (binary subtype 3)"),
    ({"type": "string", "logicalType": "uuid"}, "not-a-uuid", "payload.v", "not a UUID"),
    ({"type": "fixed", "name": "F", "size": 16}, b"short", "payload.v", "holds 5 bytes; fixed t.F has size 16"),
    ({"type": "enum", "name": "S", "symbols": ["NEW"]}, "OLD", "payload.v", "not a symbol of enum t.S"),
    ("string", Regex("a"), "payload.v", "holds regex"),
    ("string", Code("f()"), "payload.v", "holds javascript"),
    ("long", Timestamp(1, 2), "payload.v", "holds timestamp"),
    ("string", MinKey(), "payload.v", "holds minKey"),
    ("string", MaxKey(), "payload.v", "holds maxKey"),
    (LINES, [{"sku": "a", "price": Decimal128("1")}, {"sku": "b", "price": Decimal128("0.001")}],
     "payload.v[1].price", "decimal places"),
    ({"type": "map", "values": "long"}, {"ok": 1, "bad": "x"}, "payload.v['bad']", "holds string"),
    (["null", "long", "string"], 1.5, "payload.v", "matches no branch of union [null, long, string]"),
    ("string", {"a": 1}, "payload.v", "holds document"),
    ({"type": "array", "items": "int"}, "x", "payload.v", "holds string, which does not map to Avro array"),
])
def test_values_without_an_exact_mapping_are_refused_naming_the_field_path(field_type, value, path, fragment):
    with pytest.raises(UnmappableValueError) as err:
        convert(field_type, value)
    assert err.value.path == path and fragment in err.value.reason, str(err.value)


def test_undeclared_and_missing_required_fields_are_refused():
    m = mapper({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    with pytest.raises(UnmappableValueError, match=r"field 'payload.v.b' is not declared in record t.R"):
        m.convert({"v": {"a": 1, "b": 2}})
    with pytest.raises(UnmappableValueError, match=r"field 'payload.v.a' is missing; record t.R requires it"):
        m.convert({"v": {}})


@pytest.mark.parametrize("field_type, fragment", [
    ({"type": "int", "logicalType": "time-millis"}, "'time-millis' on int has no BSON mapping"),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, "'local-timestamp-millis'"),
    ({"type": "record", "name": "R", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "time-micros"}}]}, "payload.v.at"),
])
def test_payload_schemas_with_types_no_bson_value_maps_to_are_refused_up_front(field_type, fragment):
    with pytest.raises(UnsupportedSchemaError) as err:
        mapper(field_type)
    assert fragment in str(err.value)

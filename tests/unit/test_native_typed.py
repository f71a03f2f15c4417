"""Typed envelopes through the compiled encoder (native/src/typed.rs) against the Python path.

Property tests over the BSON -> Avro mapping of schemas/README.md (random payload schemas from
tests/interop/bson_cases.py, every mapping row, nested): a payload that fits its schema is built
by the compiled encoder into exactly the bytes the Python path writes; a payload that does not
fit is declined, so the Python path raises the poison error naming the event and the field path
(the compiled encoder never builds what Python refuses, and never explains a refusal itself).
"""

from __future__ import annotations

import copy
import datetime as dt
import math
from decimal import Decimal
from typing import Any

import bson
import pytest
from bson import Binary, Decimal128, Int64, ObjectId
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.errors import PoisonEventError
from relay.wiring import message_builder
from tests.interop.bson_cases import Case, typed_cases
from tests.unit.test_native import _assert_same_or_declined, _change, _outbox, _python

PROPERTIES = hsettings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GENERIC = dict(SchemaFolder.bundled().raw(ENVELOPE))
EVENT_TYPE = "PropertyEvent"


TYPED_ENVELOPE = "io.outboxrelay.test.PropertyEvent"


def _folder(payload_schema: Any) -> SchemaFolder:
    folder = SchemaFolder.bundled()
    folder.add(Case(payload_schema, {}, {}).envelope("PropertyEvent", EVENT_TYPE, GENERIC))
    return folder


def _builders(payload_schema: Any) -> tuple[Any, Any]:
    folder = _folder(payload_schema)
    return message_builder(Settings(), folder), message_builder(Settings(), folder, native=False)


def _written_with(payload_schema: Any, value: bytes) -> str:
    """The writer schema a single-object value names (its fingerprint, looked up in the folder)."""
    return _folder(payload_schema).decode_named(value)[0]


def _typed(payload: Any, **overrides: Any) -> Any:
    return _change(_outbox(payload, eventType=EVENT_TYPE, **overrides))


def _left_to_python(value: Any) -> bool:
    """Values the compiled encoder leaves to the Python path even where they fit (NaN for a
    32-bit float, binary subtypes other than 0 and 4)."""
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, Binary):
        return value.subtype not in (0, 4)
    if isinstance(value, dict):
        return any(_left_to_python(v) for v in value.values())
    if isinstance(value, list):
        return any(_left_to_python(v) for v in value)
    return False


@PROPERTIES
@given(case=typed_cases())
def test_payloads_that_fit_their_schema_are_built_identically_by_the_compiled_encoder(case):
    native, python = _builders(case.payload_schema)
    fast = _assert_same_or_declined(_typed(case.payload), native, python)
    if not _left_to_python(case.payload):
        assert fast is not None, "declined a payload that fits its schema"
        assert _written_with(case.payload_schema, fast.value) == TYPED_ENVELOPE


_STRAYS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(), st.text(max_size=8), st.builds(ObjectId), st.binary(max_size=20),
    st.binary(min_size=16, max_size=16).map(lambda b: Binary(b, 4)), st.binary(max_size=4).map(lambda b: Binary(b, 3)),
    st.sampled_from(["0", "-0", "12.50", "NaN", "-Infinity", "1E+40", "1.5E-7", "-9999999999999999999999999999999999"])
    .map(Decimal128),
    st.integers(-62_135_596_800_000, 253_402_300_799_999).map(
        lambda ms: dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)),
    st.just(bson.Regex("a")), st.just(bson.Code("x")), st.just(bson.Timestamp(1, 1)),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.sampled_from("abc"), st.integers(0, 3), max_size=2),
    st.sampled_from(["00000000-0000-0000-0000-000000000000", "ABCDEF00-0000-0000-0000-000000000000", "x",
                     "{urn:uuid:0123456789abcdef0123456789ABCDEF}", "0123456789abcdef 123456789abcdef", "é" * 32]),
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if path else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


@PROPERTIES
@given(case=typed_cases(max_leaves=8), stray=_STRAYS, data=st.data(), how=st.sampled_from(["replace", "add", "drop"]))
def test_payloads_that_do_not_fit_are_left_to_the_python_path_which_names_the_field(case, stray, data, how):
    payload = copy.deepcopy(case.payload)
    paths = _paths(payload)
    if how == "add" or not paths:
        payload["zz_undeclared"] = stray
    else:
        *parent, last = data.draw(st.sampled_from(paths))
        holder = payload
        for step in parent:
            holder = holder[step]
        if how == "drop" and isinstance(holder, dict):
            del holder[last]
        else:
            holder[last] = stray
    native, python = _builders(case.payload_schema)
    change = _typed(payload)
    _assert_same_or_declined(change, native, python)
    expected = _python(change, python)
    if isinstance(expected, PoisonEventError):
        assert "payload" in str(expected), expected


# A union of many branches, some sharing a name (string and uuid, long and timestamp-millis): the
# first branch, in schema order, that takes the value; fastavro writes the first branch of that name.
UNIONS = {
    "type": "record", "name": "U", "fields": [{"name": "v", "type": [
        "null", "int", {"type": "long", "logicalType": "timestamp-millis"}, "long", "boolean",
        {"type": "string", "logicalType": "uuid"}, "string", "float", "double",
        {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        {"type": "fixed", "name": "Id", "size": 12},
        {"type": "record", "name": "Inner", "fields": [{"name": "a", "type": "int"}]},
        {"type": "array", "items": ["null", "int", "string"]}, {"type": "map", "values": "double"},
    ]}],
}


@PROPERTIES
@given(value=st.one_of(_STRAYS, st.just({"a": 1}), st.just({"a": "x"}), st.just(1e300), st.just(0.1),
                       st.lists(st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3)), max_size=3)))
def test_unions_choose_the_branch_the_python_path_chooses(value):
    native, python = _builders(UNIONS)
    _assert_same_or_declined(_typed({"v": value}), native, python)


@pytest.mark.parametrize("value", [None, 5, Int64(2**40), True, 0.5, "s", ObjectId(), {"a": 1}, [1, None, "x"],
                                   {"k": 1.5}, Binary(b"x" * 16, 4), dt.datetime(2020, 1, 1, tzinfo=dt.UTC)])
def test_union_values_take_the_compiled_path(value):
    native, python = _builders(UNIONS)
    assert _assert_same_or_declined(_typed({"v": value}), native, python) is not None


DEFAULTS = {
    "type": "record", "name": "D", "fields": [
        {"name": "a", "type": "int"},
        {"name": "b", "type": ["null", "string"], "default": None},
        {"name": "c", "type": "string", "default": "x"},
        {"name": "d", "type": ["null", "long"]},
        {"name": "e", "type": {"type": "fixed", "name": "F", "size": 4, "logicalType": "decimal", "precision": 9,
                               "scale": 3}, "default": "\u0000\u0000\u0000\u0001"},
    ],
}


@pytest.mark.parametrize(("payload", "compiled"), [
    ({"a": 1, "c": "y", "e": Decimal128("-1.5")}, True),  # b, d absent: null
    ({"a": 1, "b": "s", "c": "y", "d": Int64(3), "e": 2}, True),
    ({"a": 1, "e": Decimal128("0.001")}, False),  # c absent: fastavro writes its default, left to Python
    ({"c": "y", "e": 1}, False),  # a required: Python refuses, naming payload.a
    ({"a": 1, "c": "y", "e": Decimal128("0.0001")}, False),  # more places than the scale
    ({"a": 1, "c": "y", "e": Decimal128("1000000")}, False),  # more digits than the precision
])
def test_absent_fields_and_decimals(payload, compiled):
    native, python = _builders(DEFAULTS)
    fast = _assert_same_or_declined(_typed(payload), native, python)
    assert (fast is not None) == compiled


@given(unscaled=st.integers(-(10**34) + 1, 10**34 - 1), scale=st.integers(0, 38), size=st.integers(16, 20),
       exponent=st.integers(-40, 40), integer=st.integers(-(2**63), 2**63 - 1))
@hsettings(max_examples=150, deadline=None)
def test_decimals_of_any_size_and_exponent(unscaled, scale, size, exponent, integer):
    schema = {"type": "record", "name": "N", "fields": [
        {"name": "b", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": scale}},
        {"name": "f", "type": {"type": "fixed", "name": "G", "size": size, "logicalType": "decimal",
                               "precision": 38, "scale": scale}}]}
    native, python = _builders(schema)
    number = Decimal128(Decimal(unscaled).scaleb(exponent))
    for value in (number, Int64(integer)):
        _assert_same_or_declined(_typed({"b": value, "f": value}), native, python)


def test_generic_and_typed_events_in_one_batch_keep_their_order():
    native, python = _builders({"type": "record", "name": "P", "fields": [{"name": "n", "type": "int"}]})
    changes = [_typed({"n": 1}), _change(_outbox({"n": 2})), _typed({"n": "poison"}), _typed({"n": 4}),
               _change(_outbox({"n": 5}, eventType="Other"))]
    built = native.build_many(changes, 7)
    assert [m is None for m in built] == [False, False, True, False, False]
    for change, message in zip(changes, built, strict=True):
        if message is not None:
            assert message == python.build(change, 7)
    with pytest.raises(PoisonEventError, match=r"payload\.n"):
        python.build(changes[2], 7)


def test_the_bundled_typed_event_takes_the_compiled_path():
    native = message_builder(Settings(), SchemaFolder.bundled())
    change = _change(_outbox({"orderId": "o-1", "amount": 1.5, "step": 1}, eventType="OrderCreated"))
    [fast] = native.build_many([change], 7)
    assert fast is not None and fast == _python(change)

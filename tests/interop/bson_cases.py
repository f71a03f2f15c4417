"""BSON payloads with the Avro value each must decode to, for property and interop tests.

A `Case` is a typed payload schema, a BSON payload document that fits it, and the value every
Avro reader must decode in the normalized form below. Both sides of a comparison are put in
this form: fastavro's decoded values (`normalize_python`) and the Java decoder's JSON output
(`normalize_java`, see java/AvroDecode.java), so one expected value checks both.

Normalized form: null, booleans, ints, strings as themselves; records and maps as dicts;
arrays as lists; `("double", bits)` for float and double (IEEE-754 bits of the double value;
every NaN is "nan"); `("bytes", data)`; `("decimal", unscaled, scale)`; `("ts_us", micros since
1970)` for both timestamp kinds; `("date", "YYYY-MM-DD")`; `("uuid", canonical text)`.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import itertools
import math
import struct
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from bson import Binary, Code, Decimal128, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.codec_options import CodecOptions
from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidBSON
from bson.int64 import Int64
from hypothesis import strategies as st

from relay.avro.contract import ENVELOPE

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MIN_DATE = dt.datetime(1, 1, 1)
MAX_DATE = dt.datetime(9999, 12, 31, 23, 59, 59, 999000)
BINARY_SUBTYPES = [0, 1, 2, 3, 4, 5, 6, 7, 8, 128, 255]


# ---- normalized values ------------------------------------------------------------------------

def n_double(value: float) -> tuple[str, str]:
    return ("double", "nan" if math.isnan(value) else struct.pack(">d", value).hex())


def n_decimal(unscaled: int, scale: int) -> tuple[str, int, int]:
    return ("decimal", unscaled, scale)


def n_ts(moment: dt.datetime) -> tuple[str, int]:
    moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    return ("ts_us", (moment - EPOCH) // dt.timedelta(microseconds=1))


def n_bytes(data: bytes) -> tuple[str, bytes]:
    return ("bytes", bytes(data))


def _unscaled(value: Decimal) -> tuple[int, int]:
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    number = int("".join(map(str, digits)))
    return (-number if sign else number), -exponent


def normalize_python(value: Any) -> Any:
    """fastavro's decoded value in the normalized form."""
    if isinstance(value, dict):
        return {k: normalize_python(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize_python(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return n_double(value)
    if isinstance(value, (bytes, bytearray)):
        return n_bytes(value)
    if isinstance(value, Decimal):
        unscaled, scale = _unscaled(value)
        return n_decimal(unscaled, scale)
    if isinstance(value, dt.datetime):
        return n_ts(value)
    if isinstance(value, dt.date):
        return ("date", value.isoformat())
    if isinstance(value, uuid.UUID):
        return ("uuid", str(value))
    raise TypeError(f"unexpected decoded type {type(value).__name__}")


def normalize_java(value: Any) -> Any:
    """The Java decoder's JSON output in the normalized form."""
    if isinstance(value, list):
        return [normalize_java(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag == "$double":
                return n_double(float(inner))
            if tag == "$bytes":
                return n_bytes(base64.b64decode(inner))
            if tag == "$decimal":
                return n_decimal(int(inner[0]), int(inner[1]))
            if tag == "$ts_us":
                return ("ts_us", int(inner))
            if tag == "$date":
                return ("date", inner)
            if tag == "$uuid":
                return ("uuid", inner)
        return {k: normalize_java(v) for k, v in value.items()}
    return value


def expected_envelope(doc: dict[str, Any], payload: Any, position: str, cluster_time: int,
                      database: str = "app", collection: str = "outbox") -> dict[str, Any]:
    """The normalized envelope a reader must decode for an outbox document."""
    return {
        "id": str(doc["_id"]), "aggregateType": doc["aggregateType"], "aggregateId": doc["aggregateId"],
        "eventType": doc["eventType"], "occurredAt": n_ts(doc["occurredAt"]), "payload": payload,
        "source": {"database": database, "collection": collection, "clusterTime": cluster_time,
                   "position": position},
    }


# ---- typed cases ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """An Avro type (names still "?") and a strategy of (BSON value, normalized expected value)."""

    schema: Any
    values: st.SearchStrategy[tuple[Any, Any]]


@dataclass(frozen=True)
class Case:
    """A payload record schema, a BSON payload that fits it, and what readers must decode."""

    payload_schema: dict[str, Any]
    payload: dict[str, Any]
    expected: dict[str, Any]

    def envelope(self, name: str, event_type: str, generic: dict[str, Any]) -> dict[str, Any]:
        """The typed envelope schema for this payload (the generic envelope's fields)."""
        fields = copy.deepcopy(generic["fields"])
        for f in fields:
            if f["name"] == "payload":
                f["type"] = self.payload_schema
            if f["name"] == "source":
                f["type"]["namespace"] = "io.outboxrelay.v1"
        return {"type": "record", "name": name, "namespace": "io.outboxrelay.test", "eventType": event_type,
                "fields": fields}


def _dates(low: dt.datetime = MIN_DATE, high: dt.datetime = MAX_DATE) -> st.SearchStrategy[dt.datetime]:
    return st.datetimes(min_value=low, max_value=high).map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, tzinfo=dt.UTC))


def _decimal_plan(kind: str) -> st.SearchStrategy[Plan]:
    def plan(precision: int, scale: int) -> Plan:
        schema: dict[str, Any] = {"type": kind, "logicalType": "decimal", "precision": precision, "scale": scale}
        if kind == "fixed":
            schema.update(name="?", size=16)
        digits = min(precision, 34)

        def value(unscaled: int, drop: int) -> tuple[Any, Any]:
            # The same number may be written with fewer places: 12.50 as 12.5 (drop trailing zeros).
            while drop and unscaled % 10**drop:
                drop -= 1
            return Decimal128(f"{unscaled // 10**drop}E-{scale - drop}"), n_decimal(unscaled, scale)
        return Plan(schema, st.tuples(st.integers(-(10**digits - 1), 10**digits - 1),
                                      st.integers(0, scale)).map(lambda t: value(*t)))
    return st.integers(1, 34).flatmap(lambda p: st.integers(0, p).map(lambda s: plan(p, s)))


def _enum_plan() -> st.SearchStrategy[Plan]:
    names = st.lists(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,6}\Z"), min_size=1, max_size=5, unique=True)
    return names.map(lambda symbols: Plan({"type": "enum", "name": "?", "symbols": symbols},
                                          st.sampled_from(symbols).map(lambda s: (s, s))))


def _binary(subtypes: list[int], size: int | None = None) -> st.SearchStrategy[Any]:
    data = st.binary(min_size=size or 0, max_size=size or 40)
    return st.tuples(data, st.sampled_from(subtypes)).map(lambda t: t[0] if t[1] == 0 else Binary(t[0], t[1]))


LEAF_PLANS: list[Plan] = [
    Plan("boolean", st.booleans().map(lambda b: (b, b))),
    Plan("int", st.integers(-(2**31), 2**31 - 1).map(lambda i: (i, i))),
    Plan("long", st.integers(-(2**63), 2**63 - 1).map(lambda i: (Int64(i), i))),
    Plan("long", st.sampled_from([-(2**63), 2**63 - 1, 0, -1]).map(lambda i: (Int64(i), i))),
    Plan("double", st.floats().map(lambda f: (f, n_double(f)))),
    Plan("double", st.integers(-(2**31), 2**31 - 1).map(lambda i: (i, n_double(float(i))))),
    Plan("float", st.floats(width=32).map(lambda f: (f, n_double(f)))),
    Plan("string", st.text(max_size=30).map(lambda s: (s, s))),
    Plan("string", st.binary(min_size=12, max_size=12).map(lambda b: (ObjectId(b), str(ObjectId(b))))),
    Plan({"type": "fixed", "name": "?", "size": 12},
         st.binary(min_size=12, max_size=12).map(lambda b: (ObjectId(b), n_bytes(b)))),
    Plan({"type": "long", "logicalType": "timestamp-millis"}, _dates().map(lambda d: (d, n_ts(d)))),
    Plan({"type": "long", "logicalType": "timestamp-millis"},
         _dates(high=dt.datetime(1969, 12, 31, 23, 59, 59, 999000)).map(lambda d: (d, n_ts(d)))),
    Plan({"type": "long", "logicalType": "timestamp-micros"}, _dates().map(lambda d: (d, n_ts(d)))),
    Plan({"type": "int", "logicalType": "date"},
         st.dates().map(lambda d: (dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC),
                                   ("date", d.isoformat())))),
    Plan("bytes", _binary(BINARY_SUBTYPES).map(lambda b: (b, n_bytes(b)))),
    Plan({"type": "fixed", "name": "?", "size": 16}, _binary([0, 4, 5, 128], 16).map(lambda b: (b, n_bytes(b)))),
    Plan({"type": "string", "logicalType": "uuid"},
         st.uuids().map(lambda u: (Binary(u.bytes, 4), ("uuid", str(u))))),
]


def _record_plan(children: st.SearchStrategy[Plan]) -> st.SearchStrategy[Plan]:
    names = st.lists(st.from_regex(r"\A[a-z][A-Za-z0-9_]{0,7}\Z"), min_size=1, max_size=5, unique=True)

    def build(names_and_plans: tuple[list[str], list[tuple[Plan, bool]]]) -> Plan:
        names, plans = names_and_plans
        fields, strategies = [], {}
        for name, (plan, optional) in zip(names, plans):
            if optional:
                ftype = plan.schema if isinstance(plan.schema, list) else ["null", plan.schema]
                fields.append({"name": name, "type": ftype, "default": None})
                strategies[name] = st.one_of(st.none(), plan.values)  # None: leave the field out
            else:
                fields.append({"name": name, "type": plan.schema})
                strategies[name] = plan.values

        def values(draw_dict: dict[str, Any]) -> tuple[Any, Any]:
            doc, expected = {}, {}
            for f in fields:
                got = draw_dict[f["name"]]
                if got is None:
                    expected[f["name"]] = None  # absent from the document: the default
                else:
                    doc[f["name"]], expected[f["name"]] = got
            return doc, expected
        return Plan({"type": "record", "name": "?", "fields": fields},
                    st.fixed_dictionaries(strategies).map(values))

    return names.flatmap(lambda ns: st.tuples(
        st.just(ns), st.lists(st.tuples(children, st.booleans()), min_size=len(ns), max_size=len(ns)))).map(build)


def _extend(children: st.SearchStrategy[Plan]) -> st.SearchStrategy[Plan]:
    keys = st.text(st.characters(blacklist_characters="\x00$.", blacklist_categories=("Cs",)), max_size=8)
    arrays = children.map(lambda p: Plan({"type": "array", "items": p.schema},
                                         st.lists(p.values, max_size=4).map(lambda vs: ([v[0] for v in vs],
                                                                                       [v[1] for v in vs]))))
    maps = children.map(lambda p: Plan({"type": "map", "values": p.schema},
                                       st.dictionaries(keys, p.values, max_size=4).map(
                                           lambda d: ({k: v[0] for k, v in d.items()},
                                                      {k: v[1] for k, v in d.items()}))))
    nullable = children.filter(lambda p: not isinstance(p.schema, list)).map(
        lambda p: Plan(["null", p.schema], st.one_of(st.just((None, None)), p.values)))
    return st.one_of(_record_plan(children), arrays, maps, nullable)


def leaf_plans() -> st.SearchStrategy[Plan]:
    return st.one_of(st.sampled_from(LEAF_PLANS), _decimal_plan("bytes"), _decimal_plan("fixed"), _enum_plan())


def _name_types(schema: Any, counter: itertools.count) -> Any:
    """A copy of `schema` whose named types ("?") get distinct names."""
    if isinstance(schema, list):
        return [_name_types(s, counter) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if out.get("name") == "?":
        out["name"] = f"T{next(counter)}"
    if "fields" in out:
        out["fields"] = [{**f, "type": _name_types(f["type"], counter)} for f in out["fields"]]
    for key in ("items", "values"):
        if key in out:
            out[key] = _name_types(out[key], counter)
    return out


@st.composite
def typed_cases(draw: st.DrawFn, max_leaves: int = 12) -> Case:
    """A random payload record schema (every BSON mapping, nested) and a payload that fits it."""
    plan = draw(_record_plan(st.recursive(leaf_plans(), _extend, max_leaves=max_leaves)))
    payload, expected = draw(plan.values)
    return Case(_name_types(plan.schema, itertools.count(1)), payload, expected)


# ---- generic (Extended JSON) payloads ---------------------------------------------------------

def _bson_leaves() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.integers(-(2**31), 2**31 - 1),
        st.integers(-(2**63), 2**63 - 1).map(Int64), st.floats(), st.text(max_size=20),
        st.binary(min_size=12, max_size=12).map(ObjectId),
        st.sampled_from(["0", "-0", "1.5E+6143", "-1E-6176", "NaN", "-Infinity", "12.50",
                         "9999999999999999999999999999999999"]).map(Decimal128),
        st.integers(-(2**63) + 1, 2**63 - 1).map(lambda ms: _date_value(ms)),
        _binary(BINARY_SUBTYPES),
        st.just(Regex("^a.b$", "im")), st.just(Code("function(){}")),
        st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
        st.just(MinKey()), st.just(MaxKey()),
    )


def _date_value(millis: int) -> Any:
    moment = DatetimeMS(millis)
    try:
        return moment.as_datetime(CodecOptions(tz_aware=True))
    except InvalidBSON:
        return moment  # outside years 1-9999: pymongo keeps it as DatetimeMS


def bson_documents() -> st.SearchStrategy[dict[str, Any]]:
    """Arbitrary BSON documents of every type (keys without '$' prefixes: Extended JSON would
    read `{"$date": ...}`-shaped user documents as type wrappers)."""
    keys = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8).filter(
        lambda k: not k.startswith("$"))
    tree = st.recursive(_bson_leaves(), lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(keys, kids, max_size=4)), max_leaves=20)
    return st.dictionaries(keys, tree, max_size=6)


def same_bson(a: Any, b: Any) -> bool:
    """Equality after a relaxed Extended JSON round trip: int32/int64 may swap, NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_bson(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_bson(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b) and (type(a) is type(b) or (isinstance(a, int) and isinstance(b, int)))


__all__ = [
    "ENVELOPE",
    "Case",
    "bson_documents",
    "expected_envelope",
    "n_bytes",
    "n_decimal",
    "n_double",
    "n_ts",
    "normalize_java",
    "normalize_python",
    "same_bson",
    "typed_cases",
]

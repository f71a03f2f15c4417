"""The compiled encoder (relay._native, native/src) against the Python path it stands in for.

For any change (relay.core.change.Change, read from a raw change event by the compiled reader,
tests.changes.change_value), `MessageBuilder.build_many` either declines it (None: the Python path builds it,
or raises the poison error) or returns exactly the message `MessageBuilder.build` builds: same
topic, key, value bytes and headers. And it does not decline the common case: valid generic
events whose payloads hold the types it writes. The whole suite runs with the compiled encoder
(`test_the_compiled_encoder_is_built_and_used` fails when it is missing).
"""

from __future__ import annotations

import datetime as dt
import struct

import bson
import pytest
from bson import Binary, Int64, ObjectId
from bson.raw_bson import RawBSONDocument
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from relay.avro.encoding import MessageBuilder
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.change import Change
from relay.core.errors import PoisonEventError
from relay.core.positions import ClusterTime
from relay.mongo.codecs import RAW_CHANGE_CODEC, read_changes
from relay.wiring import message_builder
from tests.changes import change_value, insert_change
from tests.interop.bson_cases import bson_documents

FOLDER = SchemaFolder.bundled()
SETTINGS = Settings()
NATIVE = message_builder(SETTINGS, FOLDER)
PYTHON = message_builder(SETTINGS, FOLDER, native=False)
PROPERTIES = hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOKEN = {"_data": "826B0442CE000000012B022C0100296E5A1004" + "A" * 32 + "463C5F6964003C" + "B" * 24 + "0004"}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _change(document: dict, cluster_time: bson.Timestamp = bson.Timestamp(0x6B0442CE, 1)) -> Change:
    return change_value(document, TOKEN, cluster_time, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


def _outbox(payload: object, /, **overrides: object) -> dict:
    doc = {"_id": ObjectId(), "aggregateType": "order", "aggregateId": "o-1", "eventType": "Changed",
           "payload": payload, "occurredAt": dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)}
    doc.update(overrides)
    return {k: v for k, v in doc.items() if v is not _ABSENT}


_ABSENT = object()


def _python(change: Change, builder: MessageBuilder = PYTHON) -> object:
    try:
        return builder.build(change, 7)
    except PoisonEventError as exc:
        return exc


def _assert_same_or_declined(change: Change, native: MessageBuilder = NATIVE,
                             python: MessageBuilder = PYTHON) -> object:
    [fast] = native.build_many([change], 7)
    expected = _python(change, python)
    if fast is not None:
        assert not isinstance(expected, PoisonEventError), f"native built what Python refuses: {expected}"
        assert fast == expected, (fast, expected)
    return fast


def test_the_compiled_encoder_is_built_and_used():
    import relay._native  # noqa: F401 - fails when `make setup` did not build native/

    assert NATIVE.native, "the generic envelope with single-object framing goes through relay._native"
    assert not PYTHON.native


# ---- same bytes ----------------------------------------------------------------------------------

@PROPERTIES
@given(payload=bson_documents())
def test_any_payload_is_encoded_identically_or_left_to_python(payload):
    _assert_same_or_declined(_change(_outbox(payload)))


_KEYS = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8)
_WRITTEN = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1).map(Int64),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
              st.binary(min_size=12, max_size=12).map(ObjectId),
              st.integers(-62_135_596_800_000, 253_402_300_799_999).map(lambda ms: EPOCH + dt.timedelta(milliseconds=ms)),
              st.binary(max_size=20), st.binary(min_size=16, max_size=16).map(lambda b: Binary(b, 4))),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(_KEYS, kids, max_size=4)),
    max_leaves=20)


@PROPERTIES
@given(payload=st.dictionaries(_KEYS, _WRITTEN, max_size=6))
@example(payload={"f": 1e16, "g": 1e-5, "h": 0.0001, "i": -0.0, "j": 1e15, "k": 5e-324, "l": 1.7976931348623157e308})
@example(payload={"s": "é\u2028\U0001F600\x7f\x00\"\\\n\t\b\f"})
def test_payloads_of_the_written_types_take_the_compiled_path(payload):
    assert _assert_same_or_declined(_change(_outbox(payload))) is not None, "declined a payload it writes"


@pytest.mark.parametrize("at", [0, 1, 255, 256, 257, 511, 512, 20_479])
@pytest.mark.parametrize("char", ['"', "\\", "\n", "\x1f", "\x7f", "é", "\U0001F600"])
def test_long_strings_are_escaped_wherever_the_character_that_needs_it_stands(at, char):
    """The compiled check that a string needs no escape reads blocks of 256 bytes: a character
    that needs one is found at the start, the end and either side of a block boundary."""
    plain = "".join("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i * 7 % 64] for i in range(20_480))
    text = plain[:at] + char + plain[at + 1:]
    assert _assert_same_or_declined(_change(_outbox({"data": text}))) is not None
    assert _assert_same_or_declined(_change(_outbox({"data": plain}))) is not None


@PROPERTIES
@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_doubles_are_written_as_python_repr(value):
    fast = _assert_same_or_declined(_change(_outbox({"x": value})))
    assert fast is not None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), bson.Decimal128("1.5"), bson.Regex("a"),
                                   bson.Code("x"), bson.Timestamp(1, 2), bson.MinKey(), Binary(b"x", 5)])
def test_payload_types_it_does_not_write_are_left_to_python(value):
    assert NATIVE.build_many([_change(_outbox({"v": value}))], 7) == [None]


# ---- the envelope ---------------------------------------------------------------------------------

_FIELD_VALUES = st.one_of(st.just(_ABSENT), st.none(), st.text(max_size=5), st.integers(0, 3),
                          st.builds(dict), st.just(dt.datetime(2020, 1, 1, tzinfo=dt.UTC)))


@PROPERTIES
@given(aggregate_type=_FIELD_VALUES, aggregate_id=_FIELD_VALUES, event_type=_FIELD_VALUES, payload=_FIELD_VALUES,
       occurred_at=_FIELD_VALUES, headers=st.one_of(_FIELD_VALUES, st.dictionaries(_KEYS,
                                                                                     st.one_of(st.text(max_size=4), st.integers(-5, 5)), max_size=3)),
       topic=_FIELD_VALUES, event_id=st.one_of(st.just(_ABSENT), st.text(max_size=4), st.integers(-5, 5), st.builds(ObjectId)))
def test_malformed_and_odd_documents_are_never_built_differently(aggregate_type, aggregate_id, event_type, payload,
                                                                 occurred_at, headers, topic, event_id):
    doc = _outbox({"a": 1}, aggregateType=aggregate_type, aggregateId=aggregate_id, eventType=event_type,
                  payload=payload, occurredAt=occurred_at, headers=headers, topic=topic, _id=event_id)
    _assert_same_or_declined(_change(doc))


@pytest.mark.parametrize("overrides", [
    {"headers": {"traceparent": "00-abc", "tenant": "t1"}},
    {"topic": "custom.topic"},
    {"_id": "evt-1"},
    {"occurredAt": dt.datetime(1960, 5, 6, 7, 8, 9, tzinfo=dt.UTC)},
    {"occurredAt": dt.datetime(1, 1, 1, tzinfo=dt.UTC)},
    {"aggregateId": "ключ-\U0001F600"},
])
def test_envelope_variants_take_the_compiled_path(overrides):
    assert _assert_same_or_declined(_change(_outbox({"n": 1}, **overrides))) is not None


def test_oversized_messages_are_left_to_python():
    small = Settings.load(env={"RELAY_KAFKA_MESSAGE_MAX_BYTES": "2000"})
    native, python = message_builder(small, FOLDER), message_builder(small, FOLDER, native=False)
    big = _change(_outbox({"blob": "x" * 3000}))
    assert native.build_many([big], 7) == [None] and isinstance(_python(big, python), PoisonEventError)


@pytest.mark.parametrize("template", ["{eventType}", "pre.{aggregateType}.{eventType}.post", "fixed-topic",
                                      "{aggregateType!s}", "{{x}}.{aggregateType}"])
def test_topic_templates_route_the_same(template):
    settings = Settings().replace(topic_template=template)
    _assert_same_or_declined(_change(_outbox({"n": 1})), message_builder(settings, FOLDER),
                             message_builder(settings, FOLDER, native=False))


def test_field_names_and_cluster_times_as_configured():
    settings = Settings().replace(field_aggregate_id="key", field_payload="data", field_event_type="type")
    doc = _outbox(_ABSENT, aggregateId=_ABSENT, eventType=_ABSENT, key="k-9", data={"x": [1, 2]}, type="Moved")
    for cluster_time in (bson.Timestamp(1, 0), bson.Timestamp(2**31 - 1, 2**32 - 1), bson.Timestamp(2**31, 0)):
        _assert_same_or_declined(_change(doc, cluster_time), message_builder(settings, FOLDER),
                                 message_builder(settings, FOLDER, native=False))


def test_repeated_keys_are_left_to_python():
    elements = b"\x10n\x00\x01\x00\x00\x00\x10n\x00\x02\x00\x00\x00"  # {"n": 1, "n": 2}
    duplicated = struct.pack("<i", len(elements) + 5) + elements + b"\x00"
    change = _change(_outbox({"abcdefgh": 1}))
    original = bson.encode({"abcdefgh": 1})  # same length as the duplicated document
    assert len(original) == len(duplicated)
    spliced = change._replace(document=change.document.replace(original, duplicated))
    assert NATIVE.build_many([spliced], 7) == [None]
    _assert_same_or_declined(spliced)


def test_values_that_are_not_changes_are_left_to_python():
    change = _change(_outbox({"n": 1}))
    odd = [tuple(change), change._replace(position={"data": "82"}), change._replace(cluster_time=(2**31, 0)),
           change._replace(document=bytearray(change.document))]
    assert NATIVE.build_many(odd, 7) == [None] * len(odd)


def test_changes_whose_bytes_are_a_memoryview_are_read_too():
    """pymongo hands some RawBSONDocuments a memoryview of the server's reply instead of bytes."""
    raw = insert_change(_outbox({"n": 1}), TOKEN, clusterTime=bson.Timestamp(5, 6),
                        wallTime=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    viewed = RawBSONDocument(memoryview(bytes(raw.raw)), RAW_CHANGE_CODEC)
    assert read_changes([viewed]) == read_changes([raw])
    [change], other = read_changes([raw])
    assert other == -1 and change.cluster_time == ClusterTime(5, 6) and change.wall_ms == 1_767_225_600_000
    assert NATIVE.build_many([change], 7) != [None]


@pytest.mark.parametrize("event_id", [ObjectId(), "evt-1", "", 7, Int64(2**40), 1.5, None, {"a": 1}, _ABSENT])
def test_the_reader_gives_the_event_id_as_event_id_of_does(event_id):
    from relay.core.message import event_id_of

    document = _outbox({"n": 1}, _id=event_id)
    assert _change(document).event_id == event_id_of(document)


@PROPERTIES
@given(document=bson_documents(), event_id=st.one_of(st.just(_ABSENT), st.text(max_size=4), st.builds(ObjectId),
                                                     st.integers(-5, 5), bson_documents()))
@example(document={"": None, "_id": None}, event_id=_ABSENT)
def test_the_reader_takes_any_document_as_it_is(document, event_id):
    from relay.core.message import event_id_of
    from relay.outbox import decode

    if event_id is _ABSENT:
        event_id = document.get("_id", _ABSENT)
    if event_id is not _ABSENT:  # a server stores `_id` first
        document = {"_id": event_id, **{k: v for k, v in document.items() if k != "_id"}}
    change = _change(document)
    assert change.document == bson.encode(document)
    assert change.event_id == event_id_of(decode(change.document))


def test_a_change_event_that_is_not_bson_is_named():
    good = insert_change(_outbox({"n": 1}), TOKEN).raw
    broken = good[:4] + b"\x42" + good[5:]  # its first field of a type BSON does not have
    with pytest.raises(ValueError, match="change 1"):
        read_changes([RawBSONDocument(good, RAW_CHANGE_CODEC), RawBSONDocument(broken, RAW_CHANGE_CODEC)])


def test_the_reader_keeps_the_token_whole_and_stops_at_the_first_change_that_is_not_an_insert():
    typed_bits = {"_data": TOKEN["_data"], "_typeBits": b"\x40"}
    inserted = insert_change(_outbox({"n": 1}), typed_bits)
    dropped = RawBSONDocument(bson.encode({"_id": TOKEN, "operationType": "drop"}), RAW_CHANGE_CODEC)
    changes, other = read_changes([inserted, dropped, inserted])
    assert other == 1 and [c.position for c in changes] == [typed_bits]
    assert changes[0].cluster_time == ClusterTime(0x6B0442CE, 1), "without clusterTime: the token's"


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("headers", [
    {"traceparent": TRACEPARENT},
    {"tracestate": "congo=t61rcWkgMzE", "x-tenant": "t1", "traceparent": TRACEPARENT},
    {"x-tenant": "t1"},
])
def test_trace_context_is_copied_to_the_cloudevents_extension_on_both_paths(headers):
    fast = _assert_same_or_declined(_change(_outbox({"n": 1}, headers=headers)))
    assert fast is not None, "the compiled path builds it"
    names = dict(fast.headers)
    for name, copy in (("traceparent", "ce_traceparent"), ("tracestate", "ce_tracestate")):
        if name in headers:
            assert names[name] == names[copy] == headers[name].encode()
        else:
            assert name not in names and copy not in names


def test_the_compiled_encoder_takes_the_shared_names_from_relay_core_message():
    """NATIVE_NAMES is the one place the compiled code learns header names, reserved prefixes,
    the trace headers and the topic rule: what Python refuses, it declines."""
    from relay.avro.encoding import NATIVE_NAMES
    from relay.core import message

    assert NATIVE_NAMES[3] == list(message.RESERVED_HEADER_PREFIXES)
    assert NATIVE_NAMES[4] == list(message.TRACE_HEADERS)
    for reserved in message.RESERVED_HEADER_PREFIXES:
        change = _change(_outbox({"n": 1}, headers={f"{reserved}x": "v"}))
        assert NATIVE.build_many([change], 7) == [None]
        assert isinstance(_python(change), PoisonEventError)
    for topic in ("a" * message.TOPIC_MAX_LENGTH, "a" * (message.TOPIC_MAX_LENGTH + 1), "bad topic", "ok._-"):
        _assert_same_or_declined(_change(_outbox({"n": 1}, topic=topic)))

"""The Python change reader (relay.mongo.codecs.read_in_python) against the compiled one, and the
same for the splitting of a reply's cursor into its events (cursor_batch_in_python).

An install without relay._native (a source install without Rust) reads change events with
`read_in_python`; it must hand the loop exactly the values the compiled reader does, for any
change event: inserts with any document, event id, token, cluster and wall time, and the stop at
the first change that is not an insert, and each insert's route. The compiled reader is the oracle (it is what the whole
suite runs with: tests/unit/test_native.py).
"""

from __future__ import annotations

import datetime as dt

import bson
import pytest
from bson import ObjectId
from bson.raw_bson import RawBSONDocument
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from relay.core.change import Change
from relay.core.positions import ClusterTime
from relay.mongo.codecs import RAW_CHANGE_CODEC, _event_id, cursor_batch, cursor_batch_in_python, read_in_python
from relay.outbox import decode
from tests.interop.bson_cases import bson_documents

_native = pytest.importorskip("relay._native")
COMPILED = _native.ChangeReader(Change, ClusterTime, _event_id, decode).read
PROPERTIES = hsettings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOKEN_DATA = "826B0442CE000000012B022C0100296E5A1004" + "A" * 32 + "463C5F6964003C" + "B" * 24 + "0004"

_tokens = st.one_of(
    st.just({"_data": TOKEN_DATA}),
    st.builds(lambda s: {"_data": s}, st.text(max_size=24)),
    st.builds(lambda s: {"_data": "82" + s}, st.text(alphabet="0123456789abcdefABCDEFxg+ ", min_size=16, max_size=20)),
    st.just({"_data": TOKEN_DATA, "_typeBits": b"\x40"}),
    st.just({"_data": 5}),
)
_ids = st.one_of(st.builds(ObjectId), st.text(max_size=4), st.integers(-5, 5), st.none(), bson_documents())


@st.composite
def change_events(draw: st.DrawFn) -> RawBSONDocument:
    """A raw change event as the stream hands it out, or an odd one."""
    document = draw(bson_documents())
    if draw(st.booleans()):
        document = {"_id": draw(_ids), **{k: v for k, v in document.items() if k != "_id"}}
    change: dict[str, object] = {"_id": draw(_tokens),
                                 "operationType": draw(st.sampled_from(["insert", "insert", "insert", "drop", 3]))}
    if draw(st.booleans()):
        change["clusterTime"] = draw(st.builds(bson.Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        change["wallTime"] = draw(st.one_of(
            st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)).map(
                lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, tzinfo=dt.UTC)),
            st.just("not a date")))
    if draw(st.booleans()):  # the route a shared stream's pipeline adds
        change["r"] = draw(st.one_of(st.integers(-3, 2**31 - 1), st.builds(bson.Int64, st.integers(-(2**63), 2**63 - 1)),
                                     st.booleans(), st.just("1")))
    change["fullDocument"] = document
    return RawBSONDocument(bson.encode(change), RAW_CHANGE_CODEC)


@PROPERTIES
@given(changes=st.lists(change_events(), max_size=3))
def test_the_python_reader_gives_the_compiled_readers_values_and_routes(changes):
    python_routes: list[int] = []
    compiled_routes: list[int] = []
    assert read_in_python(changes, python_routes) == COMPILED(changes, compiled_routes)
    assert python_routes == compiled_routes


def test_the_python_reader_reads_memoryviews_and_names_a_change_that_is_not_bson():
    good = bson.encode({"_id": {"_data": TOKEN_DATA}, "operationType": "insert", "fullDocument": {"_id": "e-1"}})
    viewed = RawBSONDocument(memoryview(good), RAW_CHANGE_CODEC)
    assert read_in_python([viewed]) == COMPILED([viewed])
    broken = good[:4] + b"\x42" + good[5:]  # its first field of a type BSON does not have
    with pytest.raises(ValueError, match="change 1"):
        read_in_python([RawBSONDocument(good, RAW_CHANGE_CODEC), RawBSONDocument(broken, RAW_CHANGE_CODEC)])
    without_document = bson.encode({"_id": {"_data": TOKEN_DATA}, "operationType": "insert"})
    with pytest.raises(ValueError, match="change 0: an insert without _id or fullDocument"):
        read_in_python([RawBSONDocument(without_document, RAW_CHANGE_CODEC)])


@PROPERTIES
@given(changes=st.lists(change_events(), max_size=3), first=st.booleans(), cursor_id=st.integers(0, 2**63 - 1),
       token=st.one_of(st.none(), _tokens))
def test_a_cursor_splits_into_its_events_alike_in_python_and_compiled(changes, first, cursor_id, token):
    cursor: dict[str, object] = {"id": bson.Int64(cursor_id), "ns": "shop.outbox",
                                 "firstBatch" if first else "nextBatch": changes}
    if token is not None:
        cursor["postBatchResumeToken"] = token
    raw = bson.encode(cursor)
    split = cursor_batch_in_python(raw)
    assert split == _native.cursor_batch(raw)
    assert split[:2] == (cursor_id, [bytes(c.raw) for c in changes])
    assert cursor_batch(RawBSONDocument(raw, RAW_CHANGE_CODEC))[2] == token, "the token decoded as it was sent"
    # The events as bytes read exactly as the RawBSONDocuments pymongo would have made of them.
    assert COMPILED(split[1]) == COMPILED(changes) == read_in_python(split[1])


@pytest.mark.parametrize("split", [cursor_batch_in_python, _native.cursor_batch], ids=["python", "compiled"])
def test_a_cursor_without_an_id_or_with_an_event_that_is_not_a_document_is_named(split):
    with pytest.raises(ValueError, match="has no id"):
        split(bson.encode({"nextBatch": []}))
    with pytest.raises(ValueError, match="change 1 of the reply is not a document"):
        split(bson.encode({"id": bson.Int64(0), "nextBatch": [{"a": 1}, 5]}))

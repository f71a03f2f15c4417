"""How change events are read: the one place that knows a change event's shape.

A change stream reply is split with `cursor_batch` into its cursor id, its change events left
undecoded (each its own `bytes`: no pymongo RawBSONDocument per event) and its post-batch token.
`read_changes` turns the events into the loop's values (relay.core.change.Change) in one pass
over each raw event, in the compiled reader (relay._native.ChangeReader), without decoding them:
the event id, the position (its resume token), the cluster and wall times, and the outbox
document's raw BSON. Only the Python path of the encoder decodes a document, with the outbox's
codec (relay.outbox.decode: dates outside years 1-9999 as DatetimeMS, so one such date does not
fail a whole batch).

An install without the compiled module (a source install without Rust) reads them with
`read_in_python`, which gives the same values and routes (tests/unit/test_python_reader.py), more
slowly (relay.avro.encoding says so once at start).
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from typing import Any

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument

from relay.core.change import Change
from relay.core.message import event_id_of
from relay.core.positions import ClusterTime, Token
from relay.outbox import DOCUMENT_CODEC, decode

CHANGE_CODEC: CodecOptions[Any] = DOCUMENT_CODEC
RAW_CHANGE_CODEC: CodecOptions[Any] = CHANGE_CODEC.with_options(document_class=RawBSONDocument)
# The Python reader's view of a change event: its top-level fields, documents left raw, dates as
# Unix milliseconds.
_FIELDS_CODEC: CodecOptions[Any] = CodecOptions(
    document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_MS
)


def _event_id(document: bytes) -> str:
    """The event id of a document the compiled reader leaves to Python (an `_id` that is neither
    an ObjectId nor a string, none, or a repeated key)."""
    return event_id_of(decode(document))


@functools.cache
def _reader() -> Callable[[list[Any], list[int] | None], tuple[list[Change], int]]:
    """The compiled reader (relay._native, built by `make setup`, in the published wheel), made
    once; `read_in_python` where this install has no compiled module."""
    try:
        from relay import _native
    except ImportError:
        return read_in_python
    return _native.ChangeReader(Change, ClusterTime, _event_id, decode).read  # type: ignore[no-any-return]


@functools.cache
def _splitter() -> Callable[[bytes], tuple[int, list[bytes], bytes | None]]:
    try:
        from relay import _native
    except ImportError:
        return cursor_batch_in_python
    return _native.cursor_batch  # type: ignore[no-any-return]


def cursor_batch(cursor: RawBSONDocument) -> tuple[int, list[bytes], Token | None]:
    """A change stream reply's `cursor` document as (its cursor id, its batch's change events, each
    its raw BSON as bytes, its post-batch token or None). ValueError names what the reply lacks."""
    cursor_id, changes, token = _splitter()(bytes(cursor.raw))
    return cursor_id, changes, None if token is None else decode(token)


def cursor_batch_in_python(cursor: bytes) -> tuple[int, list[bytes], bytes | None]:
    """The compiled `cursor_batch` without the compiled module (the token still raw)."""
    try:
        fields = dict(RawBSONDocument(cursor, _FIELDS_CODEC).items())
    except InvalidBSON as exc:
        raise ValueError(f"the change stream reply's cursor is not BSON: {exc}") from exc
    if not isinstance(fields.get("id"), int):
        raise ValueError("the change stream reply's cursor has no id")
    batch = fields.get("nextBatch", fields.get("firstBatch", []))
    changes = []
    for i, change in enumerate(batch):
        if not isinstance(change, RawBSONDocument):
            raise ValueError(f"change {i} of the reply is not a document")
        changes.append(bytes(change.raw))
    token = fields.get("postBatchResumeToken")
    return int(fields["id"]), changes, bytes(token.raw) if isinstance(token, RawBSONDocument) else None


def change_document(change: bytes | RawBSONDocument) -> RawBSONDocument:
    """One raw change event as a mapping of its fields (for the rare one read by name: a drop, rename
    or invalidate)."""
    return change if isinstance(change, RawBSONDocument) else RawBSONDocument(change, RAW_CHANGE_CODEC)


def read_changes(changes: list[Any], routes: list[int] | None = None) -> tuple[list[Change], int]:
    """The inserts of one read (raw change events, in stream order) as Change values, up to the
    first change that is not an insert (a drop, rename or invalidate), and that change's index
    (-1: every change is an insert); each insert's route (its field `r`, -1 without one) appended
    to `routes` when given. ValueError names a change that is not a change event."""
    return _reader()(changes, routes)


def read_in_python(changes: list[Any], routes: list[int] | None = None) -> tuple[list[Change], int]:
    """`read_changes` without the compiled module: the same values and routes, read with pymongo's bson."""
    values: list[Change] = []
    for i, change in enumerate(changes):
        raw = change if isinstance(change, bytes) else getattr(change, "raw", None)
        if raw is None:
            raise TypeError(f"change {i} has no raw BSON")
        try:
            fields = dict(RawBSONDocument(bytes(raw), _FIELDS_CODEC).items())
        except InvalidBSON as exc:
            raise ValueError(f"change {i}: not BSON: {exc}") from exc
        if fields.get("operationType") != "insert":
            return values, i
        token, document = fields.get("_id"), fields.get("fullDocument")
        if not isinstance(token, RawBSONDocument) or not isinstance(document, RawBSONDocument):
            raise ValueError(f"change {i}: an insert without _id or fullDocument")
        position: Token = decode(bytes(token.raw))
        stamp, wall, route = fields.get("clusterTime"), fields.get("wallTime"), fields.get("r")
        cluster_time = (
            ClusterTime(stamp.time, stamp.inc) if isinstance(stamp, bson.Timestamp) else _token_time(position)
        )
        wall_ms = int(wall) if isinstance(wall, DatetimeMS) else -1
        document_bytes = bytes(document.raw)
        values.append(Change(_own_id(document, document_bytes), position, cluster_time, wall_ms, document_bytes))
        if routes is not None:  # an int32 or int64 `r`, else -1
            routes.append(int(route) if isinstance(route, int) and not isinstance(route, bool) else -1)
    return values, -1


def _own_id(document: RawBSONDocument, document_bytes: bytes) -> str:
    """The event id as event_id_of gives it: an ObjectId's hex or a string read from the top
    level alone, any other `_id` from the decoded document."""
    try:
        own = document.get("_id")
    except InvalidBSON:
        own = None
    return own if isinstance(own, str) else str(own) if isinstance(own, bson.ObjectId) else _event_id(document_bytes)


def _token_time(token: Token) -> ClusterTime | None:
    """The cluster time at the start of a token's `_data` (relay.core.positions.token_cluster_time),
    None where those 16 characters are not hexadecimal digits."""
    data = token.get("_data")
    if not isinstance(data, str) or len(data) < 18 or not data.startswith("82"):
        return None
    if not all(c in string.hexdigits for c in data[2:18]):
        return None
    return ClusterTime(int(data[2:10], 16), int(data[10:18], 16))

"""How change events are read: the one place that knows a change event's shape.

The stream hands out changes undecoded (`RawBSONDocument`, RAW_CHANGE_CODEC). `read_changes`
turns them into the loop's values (relay.core.change.Change) in one pass over each raw event, in
the compiled reader (relay._native.ChangeReader), without decoding them: the event id, the
position (its resume token), the cluster and wall times, and the outbox document's raw BSON. Only
the Python path of the encoder decodes a document, with the outbox's codec (relay.outbox.decode:
dates outside years 1-9999 as DatetimeMS, so one such date does not fail a whole batch).

"""

from __future__ import annotations

import functools
from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from relay.core.change import Change
from relay.core.message import event_id_of
from relay.core.positions import ClusterTime
from relay.outbox import DOCUMENT_CODEC, decode

CHANGE_CODEC: CodecOptions[Any] = DOCUMENT_CODEC
RAW_CHANGE_CODEC: CodecOptions[Any] = CHANGE_CODEC.with_options(document_class=RawBSONDocument)


def _event_id(document: bytes) -> str:
    """The event id of a document the compiled reader leaves to Python (an `_id` that is neither
    an ObjectId nor a string, none, or a repeated key)."""
    return event_id_of(decode(document))


@functools.cache
def _reader() -> Any:
    """The compiled reader (relay._native, built by `make setup`), made once."""
    from relay import _native

    return _native.ChangeReader(Change, ClusterTime, _event_id, decode)


def read_changes(changes: list[Any], routes: list[int] | None = None) -> tuple[list[Change], int]:
    """The inserts of one read (raw change events, in stream order) as Change values, up to the
    first change that is not an insert (a drop, rename or invalidate), and that change's index
    (-1: every change is an insert); each insert's route (its field `r`, -1 without one) appended
    to `routes` when given. ValueError names a change that is not a change event."""
    return _reader().read(changes, routes)  # type: ignore[no-any-return]

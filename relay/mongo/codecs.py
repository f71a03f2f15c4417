"""How change events are decoded, and change events made by hand (rescans, tests, benchmarks).

The stream hands out changes undecoded (`RawBSONDocument`, RAW_CHANGE_CODEC): the compiled
encoder reads their bytes, and only what the Python path builds is decoded, with CHANGE_CODEC
(relay.avro.encoding.decoded). Dates outside years 1-9999 decode as DatetimeMS instead of failing
the whole batch: the generic envelope carries them as {"$date": {"$numberLong": ...}}, a typed
one refuses them (relay.avro.mapping).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

CHANGE_CODEC: CodecOptions[Any] = CodecOptions(
    tz_aware=True, tzinfo=dt.UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
RAW_CHANGE_CODEC: CodecOptions[Any] = CHANGE_CODEC.with_options(document_class=RawBSONDocument)


def insert_change(
    document: Mapping[str, Any], token: Mapping[str, Any], delivered: bool = False, raw: bool = False, **fields: Any
) -> Any:
    """An insert change event for `document` at `token` (rescans, tests, benchmarks), with any
    other change fields (`clusterTime`, `wallTime`). With `delivered`, it goes through the BSON
    round trip the driver does (CHANGE_CODEC); with `raw`, it is what the stream hands out
    (a RawBSONDocument, RAW_CHANGE_CODEC)."""
    change = {"_id": dict(token), "operationType": "insert", **fields, "fullDocument": document}
    if raw:
        return RawBSONDocument(bson.encode(change), RAW_CHANGE_CODEC)
    return bson.decode(bson.encode(change), CHANGE_CODEC) if delivered else change

"""Change events made by hand, as the stream hands them out, through the relay's own reader
(relay.mongo.codecs): for the tests and the benchmarks."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument

from relay.core.change import Change
from relay.mongo.codecs import RAW_CHANGE_CODEC, read_changes


def insert_change(document: Mapping[str, Any], token: Mapping[str, Any], **fields: Any) -> RawBSONDocument:
    """The raw insert change event of `document` at `token`, as the stream hands it out (tests,
    benchmarks), with any other change fields (`clusterTime`, `wallTime`)."""
    change = {"_id": dict(token), "operationType": "insert", **fields, "fullDocument": document}
    return RawBSONDocument(bson.encode(change), RAW_CHANGE_CODEC)


def change_value(
    document: Mapping[str, Any],
    token: Mapping[str, Any],
    cluster_time: bson.Timestamp | None = None,
    wall_time: dt.datetime | None = None,
) -> Change:
    """The Change the source hands over for the insert of `document` at `token` (tests,
    benchmarks): without `cluster_time`, the token's (relay.core.positions.token_cluster_time)."""
    fields = {"clusterTime": cluster_time, "wallTime": wall_time}
    [change], _ = read_changes([insert_change(document, token, **{k: v for k, v in fields.items() if v is not None})])
    return change

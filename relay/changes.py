"""The change stream source: where to start, and batches of events with the token after them.

Token rule (change streams spec, prose tests 11-14): after the driver returns a change, its
`resume_token` is that change's `_id`, or the batch's `postBatchResumeToken` when the change
was the last of the server's batch; after an empty getMore it is the post-batch token. Either
way the token covers exactly the changes returned so far. So a `Batch` carries the token read
right after its last change, and storing that token once every change of the batch is
delivered never skips an undelivered event.

Start point with no checkpoint (blog post, "Bootstrapping the change listener"): the oldest
oplog entry (`oplog-start`), an operator-given time, or `now` (then the relay stores the
opening token at once, so a crash cannot skip the events written meanwhile).

History lost with RELAY_ON_HISTORY_LOST=rescan (`ChangeSource.rescan`, see relay.rescan): the
stream opens at "now", every outbox document is served as a batch without a token, then an empty
batch carries the opening token, then the stream continues.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson import Timestamp
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.change_stream import ChangeStream
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from relay.errors import (
    HistoryLostError, PipelineMismatchError, StreamInvalidatedError, TransientError, translate_mongo,
)
from relay.partitioning import Partition, partition_predicate

# Inserts are the events; the other types end the stream and must not pass unseen. The
# projection keeps only what the relay reads (the resume token `_id` always stays), which
# makes each change cheaper to transfer and decode.
WATCHED_OPERATIONS = ["insert", "drop", "rename", "dropDatabase", "invalidate"]
PIPELINE: list[dict[str, Any]] = [
    {"$match": {"operationType": {"$in": WATCHED_OPERATIONS}}},
    {"$project": {"operationType": 1, "clusterTime": 1, "wallTime": 1, "fullDocument": 1}},
]


def pipeline(partition: Partition | None = None, aggregate_id_field: str = "aggregateId") -> list[dict[str, Any]]:
    """The change stream pipeline: PIPELINE for the whole outbox (RELAY_PARTITIONS=1, unchanged),
    or, for one partition, the same with inserts kept only when their aggregate id hashes to it
    (relay.partitioning; computed by the server). Every partition still sees the operations that
    end the stream, so each of them stops on a drop or rename."""
    if partition is None or partition.count == 1:
        return PIPELINE
    ending = [op for op in WATCHED_OPERATIONS if op != "insert"]
    own = {"operationType": "insert",
           **partition_predicate(partition, f"$fullDocument.{aggregate_id_field}")}
    return [{"$match": {"$or": [{"operationType": {"$in": ending}}, own]}}, *PIPELINE[1:]]


# Changes are decoded once, by the driver's C decoder, into dicts. Dates outside years 1-9999
# decode as DatetimeMS instead of failing the whole batch: the generic envelope carries them as
# {"$date": {"$numberLong": ...}}, a typed one refuses them (relay.avro_types).
CHANGE_CODEC = CodecOptions(tz_aware=True, tzinfo=dt.timezone.utc,
                            datetime_conversion=DatetimeConversion.DATETIME_AUTO)
# The stream hands out changes undecoded (RawBSONDocument): the compiled encoder reads their
# bytes, and only what the Python path builds is decoded, with CHANGE_CODEC
# (relay.encoding.decoded). Fields read on the way (the token, operationType, wallTime) decode
# with the same options.
RAW_CHANGE_CODEC = CHANGE_CODEC.with_options(document_class=RawBSONDocument)


def insert_change(document: Mapping[str, Any], token: Mapping[str, Any], delivered: bool = False,
                  raw: bool = False, **fields: Any) -> Any:
    """An insert change event for `document` at `token` (rescans, tests, benchmarks), with any
    other change fields (`clusterTime`, `wallTime`). With `delivered`, it goes through the BSON
    round trip the driver does (CHANGE_CODEC); with `raw`, it is what the stream hands out
    (a RawBSONDocument, RAW_CHANGE_CODEC)."""
    change = {"_id": dict(token), "operationType": "insert", **fields, "fullDocument": document}
    if raw:
        return RawBSONDocument(bson.encode(change), RAW_CHANGE_CODEC)
    return bson.decode(bson.encode(change), CHANGE_CODEC) if delivered else change


def pipeline_fingerprint(namespace: str, pipeline: list[dict[str, Any]] = PIPELINE) -> str:
    """A short hash of what the stored token depends on: the namespace and the pipeline."""
    text = json.dumps({"ns": namespace, "pipeline": pipeline}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def token_cluster_time(token: Mapping[str, Any] | None) -> Timestamp | None:
    """The cluster time a resume token points at (its KeyString starts with a Timestamp)."""
    if not token:
        return None
    data = token.get("_data")
    if not isinstance(data, str) or len(data) < 18 or not data.startswith("82"):
        return None
    return Timestamp(int(data[2:10], 16), int(data[10:18], 16))


def short_token(token: Mapping[str, Any] | None) -> str:
    """A token prefix for logs: the cluster time part plus a few characters."""
    if not token:
        return "-"
    data = str(token.get("_data", ""))
    return data[2:18] + "…" if len(data) > 18 else data


def oplog_start(client: MongoClient[Any]) -> Timestamp:
    """The time of the oldest entry in the oplog: the earliest a change stream can start."""
    oldest = client.local["oplog.rs"].find_one({}, projection={"ts": 1}, sort=[("$natural", 1)])
    if oldest is None:
        raise StreamInvalidatedError("the oplog is empty or unreadable: is this a replica set?")
    return oldest["ts"]


@dataclass(frozen=True)
class StartPoint:
    """Where to open the stream: after a stored token, at a time, at the oplog's start, or now."""

    resume_after: Mapping[str, Any] | None = None
    at_time: Timestamp | None = None
    oplog_start: bool = False

    @property
    def description(self) -> str:
        if self.resume_after is not None:
            return f"after checkpoint {short_token(self.resume_after)}"
        if self.at_time is not None:
            return f"at cluster time {self.at_time.time}.{self.at_time.inc}"
        return "at the oldest oplog entry" if self.oplog_start else "now"


def start_point(token: Mapping[str, Any] | None, stored_fingerprint: str | None, fingerprint: str,
                start_at: str, start_at_time: dt.datetime | None) -> StartPoint:
    """Where a leader opens the stream: after the stored token, else where RELAY_START_AT says.

    Raises PipelineMismatchError when the stored token was made by another pipeline: resuming
    with it could skip or repeat events.
    """
    if token is not None:
        if stored_fingerprint not in (None, fingerprint):
            raise PipelineMismatchError(
                f"the stored checkpoint was made by a different change stream pipeline "
                f"(fingerprint {stored_fingerprint}, now {fingerprint}); resuming could skip or "
                "repeat events. Reset the checkpoint (`outbox-relay checkpoint reset`) and set "
                "RELAY_START_AT to continue")
        return StartPoint(resume_after=token)
    if start_at == "now":
        return StartPoint()
    if start_at_time is not None:
        return StartPoint(at_time=Timestamp(int(start_at_time.timestamp()), 0))
    return StartPoint(oplog_start=True)


@dataclass
class Batch:
    """Changes in stream order, and the token that covers exactly them and all before.

    `token` is None for a batch of rescanned documents: they have no position in the stream,
    so storing nothing for them is right (a crash rescans again).
    """

    changes: list[Any] = field(default_factory=list)
    token: Mapping[str, Any] | None = None
    resumed: bool = False  # the driver resumed the stream (a resumable error) while reading it
    wall_ms: list[int] = field(default_factory=list)  # each change's wallTime (Unix ms; -1: none)

    def token_after(self, count: int) -> Mapping[str, Any] | None:
        """The token covering the first `count` changes: the last one's own resume token (its
        `_id`), or the batch's token when `count` covers the whole batch."""
        if count >= len(self.changes) or self.token is None:
            return self.token
        return _plain(self.changes[count - 1]["_id"]) if count > 0 else None


def _plain(token: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A token as a plain dict (the stream's are RawBSONDocuments), to store and compare."""
    return None if token is None else dict(token)


def inspect(changes: list[Any]) -> tuple[int, list[int]]:
    """(index of the first change that is not an insert or -1, each change's wallTime in Unix
    ms or -1), read from the raw bytes without decoding them (relay._native.inspect)."""
    from relay import _native

    return _native.inspect(changes)  # type: ignore[no-any-return]


def _take_buffered(stream: ChangeStream[Any], changes: list[Any], limit: int) -> None:
    """Append up to `limit` more changes of the server batch the driver already holds, and leave
    the stream's resume token where `try_next` would have left it after returning them one by
    one: the last change's `_id`, or the batch's post-batch token when it was the batch's last
    (change streams spec; pymongo's ChangeStream.try_next). pymongo has no batch read for change
    streams and decodes each change it returns; this takes them as they are. It reads private
    attributes of the pinned pymongo (constraints.txt); the resume tests in tests/faults check it.
    """
    cursor = stream._cursor  # noqa: SLF001
    count = min(limit, len(cursor._data))  # noqa: SLF001
    if count <= 0:
        return
    cursor._next_batch(changes, count)  # noqa: SLF001 - pops `count` buffered documents, no getMore
    if not cursor._has_next() and cursor._post_batch_resume_token:  # noqa: SLF001
        stream._resume_token = cursor._post_batch_resume_token  # noqa: SLF001
    else:
        stream._resume_token = changes[-1]["_id"]  # noqa: SLF001


class ChangeSource:
    """Reads the outbox collection's change stream in batches (relay.boundaries.ChangeSource)."""

    def __init__(self, collection: Collection[Any], max_await_ms: int, server_batch_size: int,
                 occurred_at_field: str = "occurredAt", pipeline: list[dict[str, Any]] = PIPELINE,
                 scan_filter: Mapping[str, Any] | None = None) -> None:
        """`pipeline` is the stream's (see `pipeline()`); `scan_filter` selects the documents a
        rescan serves (one partition's, with RELAY_PARTITIONS > 1)."""
        self._collection = collection.with_options(codec_options=RAW_CHANGE_CODEC)
        self._pipeline = pipeline
        self._scan_filter = scan_filter
        self._max_await_ms = max_await_ms
        self._server_batch_size = server_batch_size
        self._occurred_at_field = occurred_at_field
        self._stream: ChangeStream[Any] | None = None
        self._scan: Iterator[dict[str, Any]] | None = None
        self._ended: StreamInvalidatedError | None = None  # raised by the next read

    def open(self, start: StartPoint) -> None:
        """Open the stream at `start`; raises HistoryLostError when that point left the oplog."""
        at_time = start.at_time
        if start.oplog_start:
            at_time = oplog_start(self._collection.database.client)
        try:
            self._stream = self._collection.watch(
                self._pipeline, resume_after=start.resume_after, start_at_operation_time=at_time,
                max_await_time_ms=self._max_await_ms, batch_size=self._server_batch_size,
            )
        except PyMongoError as exc:
            error = translate_mongo(exc)
            if isinstance(error, HistoryLostError) and start.oplog_start:
                # The oldest entry was truncated between reading and opening: try again.
                raise TransientError("the oplog rolled over while opening at its start") from exc
            raise error from exc

    def rescan(self) -> None:
        """Open at "now", then serve every outbox document (relay.rescan), then the opening token."""
        from relay.rescan import rescan_changes

        self.close()
        self.open(StartPoint())
        if self.token is None:
            raise TransientError("no opening token for the stream before the rescan; retrying")
        self._scan = rescan_changes(self._collection.with_options(codec_options=CHANGE_CODEC),
                                    self._occurred_at_field, self._server_batch_size, self._scan_filter)

    @property
    def token(self) -> Mapping[str, Any] | None:
        """The stream's current token (the opening post-batch token right after `open`)."""
        return _plain(self._stream.resume_token) if self._stream is not None else None

    def next_batch(self, max_events: int) -> Batch:
        """Return the changes available now, up to `max_events`, with the token after them.

        Blocks at most about `max_await_ms` when nothing is buffered. An empty batch still
        carries the newest post-batch token, so an idle outbox's checkpoint can advance.
        Raises StreamInvalidatedError on drop / rename / invalidate, and the translated
        server error when the driver's single resume attempt fails.
        """
        assert self._stream is not None, "open() first"
        if self._scan is not None:
            return self._next_scanned(max_events)
        if self._ended is not None:
            raise self._ended
        stream = self._stream
        cursor = stream._cursor  # noqa: SLF001 - the driver swaps it when it resumes
        try:
            first = stream.try_next()  # at most one getMore and one resume (pymongo)
        except PyMongoError as exc:
            raise translate_mongo(exc) from exc
        resumed = stream._cursor is not cursor  # noqa: SLF001
        if first is None:
            return Batch([], _plain(stream.resume_token), resumed)
        changes = [first]
        _take_buffered(stream, changes, max_events - 1)
        other, wall_ms = inspect(changes)
        if other < 0:
            return Batch(changes, _plain(stream.resume_token), resumed, wall_ms)
        # A drop, rename or invalidate ends the stream: the inserts before it are published and
        # stored first, then the next read raises.
        operation = changes[other]["operationType"]
        self._ended = StreamInvalidatedError(
            f"the outbox collection saw '{operation}' (dropped or renamed?): the change stream ended; "
            "recreate the outbox and reset the checkpoint to continue")
        if other == 0:
            raise self._ended
        return Batch(changes[:other], _plain(changes[other - 1]["_id"]), resumed, wall_ms[:other])

    def _next_scanned(self, max_events: int) -> Batch:
        assert self._scan is not None
        try:
            changes = list(itertools.islice(self._scan, max_events))
        except PyMongoError as exc:
            raise translate_mongo(exc) from exc
        if changes:
            return Batch(changes, None)
        self._scan = None
        return Batch([], self.token)  # the scan is done: the opening token covers it

    def close(self) -> None:
        self._scan = None
        self._ended = None
        if self._stream is not None:
            try:
                self._stream.close()
            except PyMongoError:
                pass  # closing a cursor on a dead connection: nothing left to release
            self._stream = None

"""The offsets topic's record, and where a leader resumes in exactly-once mode (pure, no I/O).

In exactly-once mode (RELAY_DELIVERY=exactly-once) every delivery is one Kafka transaction that
also writes one record to the compacted offsets topic (RELAY_OFFSETS_TOPIC): key = the lease id
(`<db>.<collection>`, or `<db>.<collection>#<k>/<N>` with partitions), value = the resume token
covering the transaction's events, the pipeline fingerprint it belongs to, and the fencing token
and owner of the leader that wrote it (JSON, the token as canonical Extended JSON). The record is
committed atomically with the messages, so the newest committed record is exactly where the
messages visible to read_committed consumers end.

The MongoDB checkpoint is written after each commit: it lags the offsets record by at most one
transaction (a crash or a fence between the two writes), and it is ahead of it only when something
else stored it (an idle heartbeat, which covers no new event; an at-least-once run after an
exactly-once one). So a leader resumes after the newer of the two (`resume_point`), and the
MongoDB checkpoint alone decides whether there is a position at all: after `checkpoint reset`
(no MongoDB token) the relay starts at RELAY_START_AT, whatever the offsets topic holds.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS

from relay.changes import token_cluster_time
from relay.config import env_name
from relay.errors import OffsetsRecordError, PipelineMismatchError
from relay.lease import Checkpoint

RECORD_VERSION = 1
EXACTLY_ONCE = "exactly-once"


def transactional_id(lease_id: str) -> str:
    """The producer's `transactional.id`: stable per lease, so a new leader's
    `init_transactions` fences the previous leader's producer (and aborts its open transaction)."""
    return f"outbox-relay:{lease_id}"


def partition_for(lease_id: str, partitions: int) -> int:
    """The offsets topic partition a lease's records go to (and are read from): CRC-32 of the key
    modulo the partition count, chosen by the relay on both sides, never by a client's partitioner."""
    return zlib.crc32(lease_id.encode()) % max(1, partitions)


@dataclass(frozen=True)
class OffsetsRecord:
    """One committed record of the offsets topic: the token after the transaction's events."""

    lease_id: str
    token: Mapping[str, Any]
    fingerprint: str
    fencing_token: int
    owner: str

    def encode(self) -> bytes:
        return json.dumps({
            "v": RECORD_VERSION, "lease": self.lease_id,
            "token": json.loads(json_util.dumps(dict(self.token), json_options=CANONICAL_JSON_OPTIONS)),
            "fingerprint": self.fingerprint, "fencingToken": self.fencing_token, "owner": self.owner,
        }, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, lease_id: str, value: bytes, where: str) -> OffsetsRecord:
        """Parse the value of a record stored under `lease_id`; `where` (topic[partition]@offset)
        names it in the OffsetsRecordError raised for anything else."""
        try:
            doc = json.loads(value)
            token = json_util.loads(json.dumps(doc["token"]))
            record = cls(str(doc["lease"]), token, str(doc["fingerprint"]), int(doc["fencingToken"]),
                         str(doc["owner"]))
            version = int(doc["v"])
        except (ValueError, KeyError, TypeError) as exc:
            raise OffsetsRecordError(
                f"{where}: the record under key {lease_id!r} is not an outbox-relay offsets record ({exc!r}); "
                f"{env_name('offsets_topic')} must be used by the relay only") from None
        if version != RECORD_VERSION:
            raise OffsetsRecordError(f"{where}: offsets record version {version} is not {RECORD_VERSION}: "
                                     "written by another version of the relay")
        if record.lease_id != lease_id or not isinstance(token, Mapping) or "_data" not in token:
            raise OffsetsRecordError(f"{where}: the record under key {lease_id!r} holds lease "
                                     f"{record.lease_id!r} and token {token!r}")
        return record


def newer(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether token `a` lies after token `b` in the change stream. A token's `_data` is the hex
    of a KeyString whose byte order is the stream's order (cluster time first), and uppercase hex
    keeps that order, so comparing the strings compares the positions."""
    return str(a["_data"]) > str(b["_data"])


def resume_point(checkpoint: Checkpoint, record: OffsetsRecord | None, fingerprint: str,
                 topic: str) -> Checkpoint:
    """Where a leader resumes: after the newer of the MongoDB checkpoint and the newest committed
    offsets record for its lease (the module docstring says why the newer one is always right).

    - no MongoDB token (a first start, or after `checkpoint reset`): that checkpoint, whatever the
      offsets topic holds (the caller forgets that record: relay.transactions);
    - no offsets record (the outbox was published at-least-once so far): the MongoDB checkpoint;
    - a record made by another pipeline: PipelineMismatchError, as for the MongoDB checkpoint.
    """
    if checkpoint.token is None or record is None:
        return checkpoint
    if record.fingerprint != fingerprint:
        raise PipelineMismatchError(
            f"the newest record in {topic} (RELAY_OFFSETS_TOPIC) for {record.lease_id} was made by a "
            f"different change stream pipeline (fingerprint {record.fingerprint}, now {fingerprint}); "
            "resuming could skip or repeat events. Reset the checkpoint (`outbox-relay checkpoint reset`) "
            "and set RELAY_START_AT to continue")
    if not newer(record.token, checkpoint.token):
        return checkpoint
    return Checkpoint(record.token, token_cluster_time(record.token), record.fingerprint, EXACTLY_ONCE)


def forgets_record(checkpoint: Checkpoint, record: OffsetsRecord | None) -> bool:
    """Whether a new exactly-once session must tombstone the lease's offsets record before it
    starts: there is a record, but no MongoDB checkpoint (reset, or a new lineage), so that record
    belongs to a position the operator asked to leave."""
    return checkpoint.token is None and record is not None


def after_exactly_once(checkpoint: Checkpoint, read: Callable[[], OffsetsRecord | None], fingerprint: str,
                       topic: str) -> Checkpoint:
    """Where an at-least-once leader resumes: when the MongoDB checkpoint was stored by an
    exactly-once relay (RELAY_DELIVERY switched back), after the newer of it and the offsets
    topic's record, which `read()` returns (an exactly-once leader that stopped between its Kafka
    commit and its MongoDB write left the newer one in Kafka); otherwise the checkpoint, and
    Kafka is not read."""
    if checkpoint.delivery != EXACTLY_ONCE or checkpoint.token is None:
        return checkpoint
    return resume_point(checkpoint, read(), fingerprint, topic)

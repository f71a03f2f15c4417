"""The offsets topic's record (RELAY_DELIVERY=exactly-once), and the names derived from a lease.

In exactly-once mode every Kafka transaction (spanning several reads) also writes one record to the
compacted offsets topic (RELAY_OFFSETS_TOPIC): key = the lease id (`<db>.<collection>`, or
`<db>.<collection>#<k>/<N>` with partitions), value = the resume token covering the transaction's
events, the pipeline fingerprint it belongs to, and the fencing token and owner of the leader that
wrote it (JSON, the token as canonical Extended JSON). The record is committed atomically with the
messages, so the newest committed record is exactly where the messages visible to read_committed
consumers end. Where a leader resumes from it is relay.core.resume's (pure) rule.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS

from relay.core.errors import OffsetsRecordError
from relay.core.names import env_name

RECORD_VERSION = 1


def transactional_id(lease_id: str) -> str:
    """The producer's `transactional.id`: stable per lease, so a new leader's
    `init_transactions` fences the previous leader's producer (and aborts its open transaction)."""
    return f"outbox-relay:{lease_id}"


def partition_for(lease_id: str, topic_partitions: int) -> int:
    """The offsets topic's (Kafka) partition a lease's records go to (and are read from): CRC-32
    of the key modulo the topic's partition count, chosen by the relay on both sides, never by a
    client's partitioner."""
    return zlib.crc32(lease_id.encode()) % max(1, topic_partitions)


@dataclass(frozen=True)
class OffsetsRecord:
    """One committed record of the offsets topic: the token after the transaction's events."""

    lease_id: str
    token: Mapping[str, Any]
    fingerprint: str
    fencing_token: int
    owner: str

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": RECORD_VERSION,
                "lease": self.lease_id,
                "token": json.loads(json_util.dumps(dict(self.token), json_options=CANONICAL_JSON_OPTIONS)),
                "fingerprint": self.fingerprint,
                "fencingToken": self.fencing_token,
                "owner": self.owner,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, lease_id: str, value: bytes, where: str) -> OffsetsRecord:
        """Parse the value of a record stored under `lease_id`; `where` (topic[partition]@offset)
        names it in the OffsetsRecordError raised for anything else."""
        try:
            doc = json.loads(value)
            token = json_util.loads(json.dumps(doc["token"]))
            record = cls(str(doc["lease"]), token, str(doc["fingerprint"]), int(doc["fencingToken"]), str(doc["owner"]))
            version = int(doc["v"])
        except (ValueError, KeyError, TypeError) as exc:
            raise OffsetsRecordError(
                f"{where}: the record under key {lease_id!r} is not an outbox-relay offsets record ({exc!r}); "
                f"{env_name('offsets_topic')} must be used by the relay only"
            ) from exc
        if version != RECORD_VERSION:
            raise OffsetsRecordError(
                f"{where}: offsets record version {version} is not {RECORD_VERSION}: "
                "written by another version of the relay"
            )
        if record.lease_id != lease_id or not isinstance(token, Mapping) or "_data" not in token:
            raise OffsetsRecordError(
                f"{where}: the record under key {lease_id!r} holds lease {record.lease_id!r} and token {token!r}"
            )
        return record

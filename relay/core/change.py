"""What the change source hands the loop: one value per outbox insert, in batches (pure values).

The MongoDB side (relay.mongo) owns the change event's shape: it reads each raw change event once
and hands over a `Change`, so nothing outside relay/mongo indexes a change document. Everything
the loop, the poison policy and the encoders need is a field of it: the event id (for logs, the
poison policy and the dead-letter topic), the position (the resume token, stored once delivered),
the cluster time and wall time, and the outbox document's raw BSON (read by the encoders).

Token rule (change streams spec, prose tests 11-14): the token after a batch covers exactly the
changes returned so far. A `Batch` carries that token; storing it once every change of the batch
is delivered never skips an undelivered event (guarantee 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from relay.core.positions import ClusterTime, Token


class Change(NamedTuple):
    """One outbox insert as the change source hands it over (built by relay.mongo.codecs).

    - `event_id`: the outbox document's `_id` as text, as relay.core.message.event_id_of gives it,
      also for a malformed document (`<no _id>` without one);
    - `position`: the change's own resume token (a plain `{"_data": ...}` mapping, stored as the
      checkpoint unchanged); it covers this change and every one before it. A rescanned document's
      is synthetic ("00" + scan time + index: relay.mongo.rescan) and is never stored;
    - `cluster_time`: its commit's cluster time, None when unknown (a rescanned document);
    - `wall_ms`: its commit's wall time in Unix milliseconds, -1 when unknown;
    - `document`: the outbox document's raw BSON (the change's `fullDocument`).

    A named tuple: immutable, and cheap to build from the compiled reader (relay._native).
    """

    event_id: str
    position: Token
    cluster_time: ClusterTime | None
    wall_ms: int
    document: bytes


@dataclass
class Batch:
    """Changes in stream order, and the token that covers exactly them and all before.

    `token` is None for a batch of rescanned documents: they have no position in the stream,
    so storing nothing for them is right (a crash rescans again).
    """

    changes: list[Change] = field(default_factory=list)
    token: Token | None = None
    resumed: bool = False  # the source resumed the stream (a resumable error) while reading it

    def token_after(self, count: int) -> Token | None:
        """The token covering the first `count` changes: the last one's own position, or the
        batch's token when `count` covers the whole batch."""
        if count >= len(self.changes) or self.token is None:
            return self.token
        return self.changes[count - 1].position if count > 0 else None

    def wall_ms(self, start: int, end: int) -> list[int]:
        """The wall times (Unix ms, -1: unknown) of changes `start` to `end` (for latency metrics)."""
        return [change.wall_ms for change in self.changes[start:end]]

"""Positions in the change stream and what is stored about them (pure values, no I/O).

A *token* is a change stream resume token (`{"_data": "82…"}`): every change's `_id`, and every
batch's post-batch token. Its `_data` is the hex of a KeyString whose byte order is the stream's
order, cluster time first, so tokens compare as strings (`newer`) and carry their cluster time
(`token_cluster_time`).

Which token a batch carries is relay.core.change's; where a leader opens the stream (after which
token, or at which time) is relay.core.resume's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

Token = Mapping[str, Any]


class ClusterTime(NamedTuple):
    """A point in the oplog: seconds since the epoch and an increment (BSON Timestamp's fields)."""

    time: int
    inc: int


def token_cluster_time(token: Token | None) -> ClusterTime | None:
    """The cluster time a resume token points at (its KeyString starts with a Timestamp)."""
    if not token:
        return None
    data = token.get("_data")
    if not isinstance(data, str) or len(data) < 18 or not data.startswith("82"):
        return None
    return ClusterTime(int(data[2:10], 16), int(data[10:18], 16))


def short_token(token: Token | None) -> str:
    """A token prefix for logs: the cluster time part plus a few characters."""
    if not token:
        return "-"
    data = str(token.get("_data", ""))
    return data[2:18] + "…" if len(data) > 18 else data


def position_key(at: ClusterTime) -> str:
    """The position just before every change at cluster time `at`, as a string comparable with a
    token's `_data`: the KeyString's Timestamp prefix ("82", seconds, increment), which every token
    at that time extends."""
    return f"82{at.time:08X}{at.inc:08X}"


def newer(a: Token, b: Token) -> bool:
    """Whether token `a` lies after token `b` in the change stream (uppercase hex keeps the
    KeyString's byte order, so comparing the strings compares the positions)."""
    return str(a["_data"]) > str(b["_data"])


@dataclass(frozen=True)
class StartPoint:
    """Where to open the stream: after a stored token, at a time, at the oplog's start, or now."""

    resume_after: Token | None = None
    at_time: ClusterTime | None = None
    oplog_start: bool = False

    @property
    def description(self) -> str:
        if self.resume_after is not None:
            return f"after checkpoint {short_token(self.resume_after)}"
        if self.at_time is not None:
            return f"at cluster time {self.at_time.time}.{self.at_time.inc}"
        return "at the oldest oplog entry" if self.oplog_start else "now"


@dataclass(frozen=True)
class Checkpoint:
    """The stored checkpoint: the change stream token and what it was made with.

    `delivery` is the RELAY_DELIVERY of the relay that stored it (None before that was recorded):
    after `exactly-once` the offsets topic may hold a newer token (relay.core.resume).
    `seed`, while there is no token, is where a changed partition count starts this lease
    (relay.mongo.repartition). `rescan`, while there is no token, says the lease's outbox was added
    to RELAY_OUTBOXES: it starts by publishing every document it holds (relay.mongo.outboxes).
    """

    token: Token | None
    cluster_time: ClusterTime | None
    fingerprint: str | None
    delivery: str | None = None
    seed: ClusterTime | None = None
    rescan: bool = False


@dataclass(frozen=True)
class Grant:
    """A held lease: who, with which fencing token, and the checkpoint read with it."""

    owner: str
    fencing_token: int
    expires_at: dt.datetime
    checkpoint: Checkpoint


@dataclass(frozen=True)
class CheckpointWrite:
    """One scope's checkpoint on its way to the store: its lease, the grant it is stored under
    (owner and fencing token), the token (every event it covers acknowledged by the broker) and the
    pipeline fingerprint stored beside it."""

    lease_id: str
    grant: Grant
    token: Token
    fingerprint: str

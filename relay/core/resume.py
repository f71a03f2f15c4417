"""Where a new leading session resumes, in exactly-once mode and after it (pure, no I/O).

In exactly-once mode (RELAY_DELIVERY=exactly-once) every Kafka transaction (spanning several
reads) also writes the token covering it to the offsets topic (relay.kafka.offsets_record). The MongoDB
checkpoint is written after each commit: it lags the offsets record by at most one transaction (a
crash or a fence between the two writes), and it is ahead of it only when something else stored
it (an idle heartbeat, which covers no new event; an at-least-once run after an exactly-once one).
So a leader resumes after the newer of the two (`resume_point`), and the MongoDB checkpoint alone
decides whether there is a position at all: after `checkpoint reset` (no MongoDB token) the relay
starts at RELAY_START_AT, whatever the offsets topic holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from relay.core.config import EXACTLY_ONCE
from relay.core.errors import PipelineMismatchError
from relay.core.positions import Checkpoint, Token, newer, token_cluster_time


class Committed(Protocol):
    """The newest committed offsets record of a lease (relay.kafka.offsets_record.OffsetsRecord)."""

    @property
    def lease_id(self) -> str: ...
    @property
    def token(self) -> Token: ...
    @property
    def fingerprint(self) -> str: ...


def resume_point(checkpoint: Checkpoint, record: Committed | None, fingerprint: str, topic: str) -> Checkpoint:
    """Where a leader resumes: after the newer of the MongoDB checkpoint and the newest committed
    offsets record for its lease (the module docstring says why the newer one is always right).

    - no MongoDB token (a first start, or after `checkpoint reset`): that checkpoint, whatever the
      offsets topic holds (the caller forgets that record: relay.kafka.transactions);
    - no offsets record (the outbox was published at-least-once so far): the MongoDB checkpoint;
    - a record made by another pipeline: PipelineMismatchError, as for the MongoDB checkpoint.
    """
    if checkpoint.token is None or record is None:
        return checkpoint
    if record.fingerprint != fingerprint:
        raise PipelineMismatchError.between(
            f"the newest record in {topic} (RELAY_OFFSETS_TOPIC) for {record.lease_id}", record.fingerprint, fingerprint
        )
    if not newer(record.token, checkpoint.token):
        return checkpoint
    return Checkpoint(record.token, token_cluster_time(record.token), record.fingerprint, EXACTLY_ONCE)


def forgets_record(checkpoint: Checkpoint, record: Committed | None) -> bool:
    """Whether a new exactly-once session must tombstone the lease's offsets record before it
    starts: there is a record, but no MongoDB checkpoint (reset, or a new lineage), so that record
    belongs to a position the operator asked to leave."""
    return checkpoint.token is None and record is not None


def after_exactly_once(
    checkpoint: Checkpoint, read: Callable[[], Committed | None], fingerprint: str, topic: str
) -> Checkpoint:
    """Where an at-least-once leader resumes: when the MongoDB checkpoint was stored by an
    exactly-once relay (RELAY_DELIVERY switched back), after the newer of it and the offsets
    topic's record, which `read()` returns (an exactly-once leader that stopped between its Kafka
    commit and its MongoDB write left the newer one in Kafka); otherwise the checkpoint, and
    Kafka is not read."""
    if checkpoint.delivery != EXACTLY_ONCE or checkpoint.token is None:
        return checkpoint
    return resume_point(checkpoint, read(), fingerprint, topic)

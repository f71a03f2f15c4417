"""Poison events in the inbox, with the relay's policy names (`stop` / `dead-letter`).

A message is poison when it cannot be decoded (`relay.inbox.decoding`) or when the handler raises
for it (`relay.inbox.errors.HandlerError`). The events before it in its batch are applied and
committed first; then, under

- `stop` (default): one ERROR line as the relay writes it (`stopping on InboxPoisonError: ...`,
  fields `error_kind`, `event_id`, `reason`, `exit_code`, `cause`) plus `topic`, `partition`,
  `offset`, and `Inbox.run` raises InboxPoisonError. Its offset and everything after it stay
  uncommitted: a restart stops at the same message.
- `dead-letter`: the message goes to the dead-letter topic (its value and headers unchanged, plus
  `relay_dead_letter_reason` as the relay names it and `relay_inbox_source` =
  `topic/partition/offset`), is recorded in the inbox as dead-lettered once the broker
  acknowledged it, and the batch goes on after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relay.avro.deadletter import HEADER_REASON
from relay.core.errors import PoisonEventError
from relay.inbox.batching import Poisoned
from relay.ops.observe import stop_log, write_stop_line

HEADER_SOURCE = "relay_inbox_source"
HEADER_GROUP = "relay_inbox_group"


class InboxPoisonError(PoisonEventError):
    """Raised by `Inbox.run` when it stops at a poison event (policy `stop`); names where it is."""

    def __init__(self, poisoned: Poisoned) -> None:
        event_id = poisoned.event_id or "<undecodable>"
        super().__init__(event_id, poisoned.reason)
        self.args = (
            f"poison event {event_id} at {poisoned.topic}[{poisoned.partition}]@{poisoned.offset}: {poisoned.reason}",
        )
        self.topic = poisoned.topic
        self.partition = poisoned.partition
        self.offset = poisoned.offset


def where(poisoned: Poisoned) -> dict[str, Any]:
    return {"topic": poisoned.topic, "partition": poisoned.partition, "offset": poisoned.offset}


def stop_at(poisoned: Poisoned) -> InboxPoisonError:
    """Write the stop line for `poisoned` and return the error `run` raises."""
    error = InboxPoisonError(poisoned)
    write_stop_line(error, where(poisoned))
    return error


@dataclass(frozen=True)
class DeadLetter:
    """The record standing in for a poison message on the dead-letter topic."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, str | bytes | None]]


def dead_letter(
    poisoned: Poisoned, topic: str, group_id: str, key: bytes | None, value: bytes | None, headers: list[Any]
) -> DeadLetter:
    """The message as it was, with the reason and where it came from in headers."""
    kept: list[tuple[str, str | bytes | None]] = [(k, v) for k, v in headers if v is not None]
    kept += [
        (HEADER_REASON, poisoned.reason.encode()[:2000]),
        (HEADER_SOURCE, f"{poisoned.topic}/{poisoned.partition}/{poisoned.offset}".encode()),
        (HEADER_GROUP, group_id.encode()),
    ]
    if poisoned.event_id and not any(k == "ce_id" for k, _ in kept):
        kept.append(("ce_id", poisoned.event_id.encode()))
    return DeadLetter(topic, key, value, kept)


def log_dead_letter(poisoned: Poisoned, topic: str) -> None:
    stop_log.error(
        "dead-lettering event %s to %s: %s",
        poisoned.event_id,
        topic,
        poisoned.reason,
        extra={"event_id": poisoned.event_id, "reason": poisoned.reason, **where(poisoned)},
    )

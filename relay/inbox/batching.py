"""The batching and skipping rules, pure: what a batch runs, what it skips, which offsets it commits.

A batch is what one poll gathered, in the order the consumer delivered it (per partition, offset
order). Invariants, each enforced by one function here and tested with in-memory values
(tests/unit/test_inbox_rules.py):

- `split_at_poison`: a batch is applied only up to its first poison message; nothing after it is
  run or committed in the same step (the stop policy commits nothing after the poison event).
- `plan`: an event whose id is already recorded, or that appeared earlier in the same batch, is
  skipped; the others run in delivery order (so one aggregate's events keep the relay's order).
- `offsets_to_commit`: per partition, the offset after the last message of the batch (Kafka's
  committed offset is the next one to read), only for partitions the batch holds.
- `without_partitions`: messages of partitions revoked in a rebalance are dropped from a batch
  not yet applied, so nothing is committed for a partition this consumer lost.
- `BatchLimits`: a batch closes at `max_events` messages or `max_seconds` after its first one;
  `Gathering` says how long each poll of one batch may wait and when the batch is complete (the
  consumer, relay.inbox.consumer, only polls).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Delivered(Protocol):
    """A consumed message as the rules see it: its coordinates."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


class Identified(Delivered, Protocol):
    """A decoded event: coordinates and the event id the inbox records."""

    @property
    def event_id(self) -> str: ...


M = TypeVar("M", bound=Delivered)
E = TypeVar("E", bound=Identified)


@dataclass(frozen=True)
class Poisoned:
    """A message that is not a usable event (it could not be decoded, or its handler raised);
    `event`: the decoded event whose handler raised (None: undecodable)."""

    topic: str
    partition: int
    offset: int
    event_id: str | None
    reason: str
    event: Identified | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Plan(Generic[E]):
    """The events a batch runs (in order) and the ones it skips as duplicates."""

    run: list[E] = field(default_factory=list)
    skip: list[E] = field(default_factory=list)


@dataclass(frozen=True)
class BatchLimits:
    """How large a batch may grow: at most `max_events` messages, gathered for at most
    `max_seconds` after the first one arrived (both positive)."""

    max_events: int = 500
    max_seconds: float = 0.2

    def __post_init__(self) -> None:
        if self.max_events <= 0 or self.max_seconds <= 0:
            raise ValueError(f"batch limits must be positive, got {self.max_events} events, {self.max_seconds} s")

    def room(self, gathered: int) -> int:
        return max(self.max_events - gathered, 0)

    def closed(self, gathered: int, first_at: float | None, now: float) -> bool:
        """Whether a batch of `gathered` messages, the first received at `first_at`, is complete."""
        if gathered >= self.max_events:
            return True
        return first_at is not None and now - first_at >= self.max_seconds


@dataclass
class Gathering:
    """One batch being gathered: how long the next poll may wait, and whether to poll again.

    The first poll waits up to `idle_s` (an idle consumer notices a stop that quickly); once a
    message arrived, the batch closes at `limits` (count, or `max_seconds` after the first
    message) or at the first poll that returns nothing (the consumer has caught up)."""

    limits: BatchLimits
    idle_s: float
    first_at: float | None = None

    def wait(self, gathered: int, now: float) -> float | None:
        """How long the next poll may wait; None when the batch is complete."""
        if self.limits.closed(gathered, self.first_at, now):
            return None
        if self.first_at is None:
            return self.idle_s
        return max(self.first_at + self.limits.max_seconds - now, 0.0)

    def polled(self, gathered: int, received: int, now: float) -> bool:
        """After a poll that returned `received` messages (`gathered` kept so far): whether to
        poll again. An idle first poll, or an empty poll after the first message, ends it."""
        if gathered == 0 or (received == 0 and self.first_at is not None):
            return False
        if self.first_at is None:
            self.first_at = now
        return True


def split_at_poison(batch: Sequence[M | Poisoned]) -> tuple[list[M], Poisoned | None, list[M | Poisoned]]:
    """(the messages before the first poison one, that poison message or None, the rest after it)."""
    for index, item in enumerate(batch):
        if isinstance(item, Poisoned):
            return list(batch[:index]), item, list(batch[index + 1 :])  # type: ignore[arg-type]
    return list(batch), None, []  # type: ignore[arg-type]


def plan(events: Iterable[E], recorded: Collection[str]) -> Plan[E]:
    """Which events run: not recorded before, and not already seen earlier in this batch."""
    result: Plan[E] = Plan()
    seen: set[str] = set()
    for event in events:
        if event.event_id in recorded or event.event_id in seen:
            result.skip.append(event)
        else:
            seen.add(event.event_id)
            result.run.append(event)
    return result


def offsets_to_commit(batch: Iterable[Delivered]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the offset to commit: one past the highest offset of the batch."""
    offsets: dict[tuple[str, int], int] = {}
    for item in batch:
        key = (item.topic, item.partition)
        offsets[key] = max(offsets.get(key, 0), item.offset + 1)
    return offsets


def without_partitions(batch: Iterable[M], lost: Collection[tuple[str, int]]) -> list[M]:
    """The batch without the messages of the partitions in `lost` (revoked before it was applied)."""
    return [item for item in batch if (item.topic, item.partition) not in lost]

"""The poison policy (RELAY_ON_POISON): what happens to an event that cannot be published.

An event is poison when it cannot become a Kafka message (malformed, not encodable, larger than
`message.max.bytes`) or when the broker refuses it for good (larger than the topic accepts). The
broker refuses whole record batches, so a refused batch is first replayed one message per
request to find the event responsible. The policy returns one `Decision` per error:

| error | `stop` (default) | `dead-letter` |
| --- | --- | --- |
| `BatchRefusedError` | ISOLATE: replay its events one per request | ISOLATE |
| `PoisonEventError` | STOP at the event: the events before it are published and checkpointed, then the relay stops naming it | DEAD_LETTER: the event goes to the dead-letter topic in its place, with the reason |

Events refused by the broker are remembered (event id -> reason) for the replay that puts them on
the dead-letter topic; events the relay itself cannot encode are dead-lettered as they are met.

A third policy, `skip`, is `outbox-relay replay`'s alone (not a RELAY_ON_POISON value): an event
the encoder refuses is left out, with no message in its place, and the caller is told (the replay
writes a WARNING and counts it). The live relay keeps guarantee 6 (a poison event stops it or is
dead-lettered, never dropped): its loop also relies on one message per change (each parcel's
token and wall times are the changes' at the same indexes), which a skipped event would break.
The replay may skip because it publishes again what the live relay already stopped at or
dead-lettered. A broker's refusal is not the encoder's: under `skip` it is decided as under `stop`.
Nothing here does I/O; the loop (`relay.core.loop`) and the replay act on the decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

from relay.core.boundaries import Encoder
from relay.core.change import Change
from relay.core.config import DEAD_LETTER, POISON_POLICIES, SKIP, STOP
from relay.core.errors import BatchRefusedError, PoisonEventError
from relay.core.message import OutgoingMessage


class Decision(enum.Enum):
    STOP = STOP
    DEAD_LETTER = DEAD_LETTER
    ISOLATE = "isolate"


class PoisonPolicy:
    """RELAY_ON_POISON (`stop` or `dead-letter`; `skip`: the replay's) and what it has learned so far."""

    def __init__(self, on_poison: str) -> None:
        if on_poison not in (*POISON_POLICIES, SKIP):
            raise ValueError(f"unknown poison policy {on_poison!r}")
        self.dead_letters = on_poison == DEAD_LETTER
        self.skips = on_poison == SKIP
        self._refused: dict[str, str] = {}  # event id -> the broker's reason
        self._one_by_one = 0  # events still to send one per request

    def decide(self, error: PoisonEventError | BatchRefusedError) -> Decision:
        """What to do about `error`; remembers what the replay needs."""
        if isinstance(error, BatchRefusedError):
            self._one_by_one = max(self._one_by_one, error.events)
            return Decision.ISOLATE
        if self.dead_letters:
            self._refused[error.event_id] = error.reason
            return Decision.DEAD_LETTER
        return Decision.STOP

    def refused(self, event_id: str) -> str | None:
        """The reason the broker refused this event for good, if it did (dead-letter policy)."""
        return self._refused.get(event_id) if self._refused else None

    @property
    def remembers_refusals(self) -> bool:
        return bool(self._refused)

    @property
    def one_by_one(self) -> int:
        """How many of the next events go one message per request (after a refused batch)."""
        return self._one_by_one

    def sent_alone(self) -> None:
        """One of those events was acknowledged in a request of its own."""
        if self._one_by_one:
            self._one_by_one -= 1


def encode(
    changes: Sequence[Change],
    fencing_token: int,
    encoder: Encoder,
    policy: PoisonPolicy,
    set_aside: Callable[[str, str], None],
) -> tuple[list[OutgoingMessage], PoisonEventError | None]:
    """The messages for `changes`, in order, with the policy applied as they are built.

    Under the dead-letter policy a poison event's dead letter takes its place; under the skip
    policy (the replay's) it has no message; either way `set_aside(event_id, reason)` is told.
    Under the stop policy the messages end before the first poison event, which is returned with
    them. So messages and changes correspond one to one, but under `skip`. The encoder's batch
    path (`build_many`) goes first; what it declines is built one by one.
    """
    fast = [None] * len(changes) if policy.remembers_refusals else encoder.build_many(changes, fencing_token)
    if None not in fast:
        return fast, None  # type: ignore[return-value]
    messages: list[OutgoingMessage] = []
    for change, built in zip(changes, fast, strict=True):
        message = built
        if message is None:
            try:
                if policy.remembers_refusals:
                    reason = policy.refused(change.event_id)
                    if reason is not None:
                        raise PoisonEventError(change.event_id, reason)
                message = encoder.build(change, fencing_token)
            except PoisonEventError as exc:
                if not (policy.dead_letters or policy.skips):
                    return messages, exc
                set_aside(exc.event_id, exc.reason)
                if policy.skips:
                    continue
                message = encoder.dead_letter(change, exc.reason, fencing_token)
        messages.append(message)
    return messages, None

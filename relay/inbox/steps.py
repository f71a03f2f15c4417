"""The order of a batch's steps, written once for both inboxes.

`BatchSteps.steps(batch, items)` is a generator that performs no I/O: it yields the next thing to
do (an action) and receives what it did. The sync inbox (relay.inbox.inbox.Steps) does each action
with blocking calls, the async one (relay.inbox.async_inbox.AsyncSteps) with awaits; `drive` and
`drive_async` are the two loops, and neither decides anything. The guarantees, enforced here:

- a batch is applied in one MongoDB transaction (`Apply`) up to its first poison message
  (`batching.split_at_poison`); the handler never sees what follows a poison message before the
  poison policy ran;
- offsets are committed (`Commit`) only after the transaction holding their events committed, and
  only up to the messages it holds: nothing from a poison message on;
- when the handler raises for an event (the driver throws HandlerError back in), the transaction
  was aborted: the events before it are applied in a new one, then it is poison;
- poison, policy `stop`: the events before it committed, then `InboxPoisonError` (nothing from it
  on is committed: a restart stops there again); policy `dead-letter`: sent and acknowledged
  (`SendDeadLetter`), then recorded (`RecordDeadLetter`, when it has an event id), then its
  offset committed, then the rest of the batch in the same way.

Retries (relay.inbox.retrying) are the drivers' way of doing one action; `BatchSteps` holds the
policy both use. The metrics are counted here, where each outcome is known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from relay.core.errors import SchemaRegistryUnavailableError
from relay.inbox.batching import BatchLimits, Poisoned, offsets_to_commit, split_at_poison
from relay.inbox.config import RunOptions
from relay.inbox.consumer import Received
from relay.inbox.decoding import EventDecoder, UndecodableMessageError
from relay.inbox.errors import HandlerError
from relay.inbox.event import InboxEvent
from relay.inbox.metrics import InboxMetrics
from relay.inbox.poison import log_dead_letter, stop_at
from relay.inbox.records import Applied
from relay.inbox.retrying import Retry
from relay.inbox.stopping import StopRequested, StopSignal

log = logging.getLogger("relay.inbox")
Item = InboxEvent | Poisoned


@dataclass(frozen=True)
class Apply:
    """Run the handler for `events` and record them in one transaction (retried past transient
    failures). Replies `Applied`; or raises HandlerError, thrown back into the steps."""

    events: list[InboxEvent]


@dataclass(frozen=True)
class Commit:
    """Commit these Kafka offsets ((topic, partition) -> next offset to read)."""

    offsets: dict[tuple[str, int], int]


@dataclass(frozen=True)
class SendDeadLetter:
    """Send the poison message to the dead-letter topic; returns once the broker acknowledged it."""

    poisoned: Poisoned
    message: Received


@dataclass(frozen=True)
class RecordDeadLetter:
    """Record the dead-lettered event in the inbox (its own transaction, retried); `event`: the
    decoded event, whose fields the record keeps (None: the message could not be decoded)."""

    event_id: str
    where: tuple[str, int, int]
    event: InboxEvent | None = None


Action = Apply | Commit | SendDeadLetter | RecordDeadLetter
Procedure = Generator[Action, Any, None]
# What `_apply` returns: (applied, the poison event or None, the events after it).
ApplyOutcome = tuple[list[InboxEvent], Poisoned | None, list[InboxEvent]]


def decode_all(decoder: EventDecoder, batch: Sequence[Received]) -> list[Item]:
    """Each message's event, or a poison item when the message is at fault (undecodable, named by
    its `ce_id` header); a registry that cannot be reached raises (the batch is decoded again)."""
    items: list[Item] = []
    for msg in batch:
        headers = msg.headers
        try:
            items.append(decoder.decode(msg.topic, msg.partition, msg.offset, msg.value, headers))
        except UndecodableMessageError as exc:
            items.append(Poisoned(msg.topic, msg.partition, msg.offset, headers.get("ce_id"), f"cannot decode: {exc}"))
    return items


class BatchSteps:
    """What one `run` call of either inbox does with a batch, apart from the I/O."""

    def __init__(self, metrics: InboxMetrics, stop: StopSignal, options: RunOptions) -> None:
        self.metrics, self.stop, self.options = metrics, stop, options
        self.limits = BatchLimits(options.batch_max_events, options.batch_max_ms / 1000)
        self.retry = Retry(options.retry_backoff_max_s, stop, self._retrying)
        self.dead_lettering = options.on_poison == "dead-letter"

    def steps(self, batch: Sequence[Received], items: Sequence[Item]) -> Procedure:
        """The actions for one decoded batch, in their order (the module docstring)."""
        messages = {(m.topic, m.partition, m.offset): m for m in batch}
        for item in items:
            if isinstance(item, Poisoned):
                self.metrics.poison(item.topic, "undecodable")
        rest = list(items)
        while rest:
            events, poisoned, after_poison = split_at_poison(rest)
            applied, handler_poison, after = yield from self._apply(events)
            if applied:
                yield Commit(offsets_to_commit(applied))
            if handler_poison is not None:
                poisoned, after_poison = handler_poison, [*after, *([poisoned] if poisoned else []), *after_poison]
            if poisoned is None:
                return
            self.metrics.totals["poison"] += 1
            yield from self._poison(poisoned, messages[(poisoned.topic, poisoned.partition, poisoned.offset)])
            rest = after_poison

    def _apply(self, events: list[InboxEvent]) -> Generator[Action, Any, ApplyOutcome]:
        """Apply `events` in one transaction; when the handler raises for one, apply the events
        before it instead. Returns (applied, the poison event or None, the events after it)."""
        if not events:
            return [], None, []
        started = time.monotonic()
        try:
            done: Applied = yield Apply(events)
        except HandlerError as exc:
            self.metrics.poison(exc.event.topic, "handler_errors")
            index = events.index(exc.event)
            applied, poisoned, after = yield from self._apply(events[:index])
            if poisoned is not None:  # the handler failed earlier this time: stop there
                return applied, poisoned, [*after, *events[index:]]
            e = exc.event
            return applied, Poisoned(e.topic, e.partition, e.offset, e.event_id, str(exc), e), events[index + 1 :]
        self.metrics.applied(done.ran, done.skipped, done.attempts)
        self.metrics.batch_seconds.observe(time.monotonic() - started)
        return events, None, []

    def _poison(self, poisoned: Poisoned, message: Received) -> Procedure:
        """The policy for one poison message: raise under `stop`, else dead-letter it and go on."""
        if not self.dead_lettering:
            raise stop_at(poisoned)
        log_dead_letter(poisoned, self.options.dead_letter_topic)
        yield SendDeadLetter(poisoned, message)
        if poisoned.event_id is not None:
            event = poisoned.event if isinstance(poisoned.event, InboxEvent) else None
            yield RecordDeadLetter(poisoned.event_id, (poisoned.topic, poisoned.partition, poisoned.offset), event)
        self.metrics.poison(poisoned.topic, "dead_letters")
        yield Commit(offsets_to_commit([poisoned]))

    def _retrying(self, failure: BaseException, wait_s: float) -> None:
        cause = "registry" if isinstance(failure, SchemaRegistryUnavailableError) else "transaction"
        log.warning("batch %s failed, retrying in %.1fs: %s", cause, wait_s, failure, extra={"cause": str(failure)})
        self.metrics.retried(cause)

    def abandoned(self, batch: Sequence[Received], stopped: StopRequested) -> None:
        """A stop asked while the batch waited to be retried: it is left uncommitted."""
        log.warning(
            "stopping with a batch of %d messages left uncommitted (it is read again): %s",
            len(batch),
            stopped.cause,
            extra={"cause": str(stopped.cause)},
        )

    def after_step(self, lags: dict[tuple[str, int], int]) -> None:
        self.metrics.set_lags(lags)
        self.metrics.summarize()

    def close(self) -> None:
        """The last summary line; the lag series of this run removed."""
        self.metrics.set_lags({})
        self.metrics.summarize(force=True)


def drive(steps: Procedure, do: Callable[[Action], Any]) -> None:
    """Run `steps`, doing each action with `do` (blocking); a HandlerError from `do` is thrown
    back into `steps`, which decides what follows. Any other error ends the batch."""
    reply: Any = None
    failure: HandlerError | None = None
    try:
        while True:
            try:
                action = steps.throw(failure) if failure is not None else steps.send(reply)
            except StopIteration:
                return
            reply, failure = None, None
            try:
                reply = do(action)
            except HandlerError as exc:
                failure = exc
    finally:
        steps.close()


async def drive_async(steps: Procedure, do: Callable[[Action], Awaitable[Any]]) -> None:
    """`drive` for the async inbox: each action awaited."""
    reply: Any = None
    failure: HandlerError | None = None
    try:
        while True:
            try:
                action = steps.throw(failure) if failure is not None else steps.send(reply)
            except StopIteration:
                return
            reply, failure = None, None
            try:
                reply = await do(action)
            except HandlerError as exc:
                failure = exc
    finally:
        steps.close()

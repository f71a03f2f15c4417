"""One leading session's RabbitMQ publisher (relay.core.boundaries.Publisher): each parcel's
messages published in order on the session's own channel with publisher confirms and the
`mandatory` flag, many confirms in flight, the parcel reported once RabbitMQ confirmed every
message of it (a `basic.ack`: every queue the message was routed to took it; a quorum queue once a
majority of its replicas stored it) or one of them failed.

Two threads, each piece of state with one owner:

| part | owned by | what it holds |
| --- | --- | --- |
| `RabbitPublisher` | the loop's thread | what relay.core.handover.HandOverPublisher holds (messages not yet reported, the first failure it took), the server's frame_max |
| `Sender` | the event loop's thread (relay.loop_thread) | the channel, the next delivery tag, each unconfirmed tag's parcel (`_unconfirmed`), the first failure it saw (`_stopped`), why the server blocked the connection |
| `reports` (a `queue.SimpleQueue`) | both: the sender puts `(parcel, count, failure)`, the publisher takes | |

A parcel itself is touched only on the loop's thread: the sender gets its messages as plain tuples
and its deadline as a number, and hands the parcel back untouched in its report.

Rules, each enforced here:
- Messages go on the wire in send order: `hand` runs on the event loop's thread in the order the
  parcels were handed over (`EventLoopThread.call` keeps it) and publishes every message of one
  (pika's `basic_publish` writes it at once) before it returns.
- A parcel is reported acknowledged only once every one of its delivery tags was confirmed with a
  `basic.ack` (one by one, or `multiple`, in any order). A `basic.return` (the message was
  unroutable: RabbitMQ sends it before that message's ack), a `basic.nack`, a closed channel or
  connection, or a confirm missing after RELAY_RABBITMQ_CONFIRM_TIMEOUT_MS fails it.
- After the first failure nothing more goes on the wire: every parcel handed over later fails
  unsent. A return or a nack names one message: the messages already on the wire are still
  confirmed (so what precedes a poison event is stored before the relay stops at it); a closed
  channel or connection, or a missing confirm, fails every parcel in flight (the connection is
  closed). The loop then publishes again from its stored checkpoint on a fresh connection, in order;
  consumers drop the copies by `message_id`.
- A parcel whose `publish_by` passed before the sender took it is not sent (its lease was no longer
  provably held: a replica paused there wakes up without publishing it).
"""

from __future__ import annotations

import contextlib
import queue
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pika import spec
from pika.exceptions import ChannelClosed, ConnectionClosed

from relay.core.errors import ConfigError, DeliveryError, PoisonEventError, ServerRefusedError
from relay.core.handover import HandOverPublisher, LeaseNotHeld, Report, Unsent
from relay.core.message import OutgoingMessage
from relay.core.names import env_name
from relay.core.window import Parcel
from relay.loop_thread import EventLoopThread
from relay.rabbitmq.errors import ACCESS_REFUSED, PRECONDITION_FAILED, describe
from relay.rabbitmq.messages import Message, to_amqp

# RabbitMQ's words when a message is larger than its max_message_size (the channel closes, 406).
_TOO_LARGE = re.compile(r"message size (\d+) is larger than configured max size (\d+)")


class Returned(Exception):
    """RabbitMQ returned a mandatory message (`basic.return`): no queue took it."""

    def __init__(self, reply_code: int, reply_text: str, exchange: str, routing_key: str) -> None:
        super().__init__(f"{reply_text} ({reply_code})")
        self.reply_code, self.reply_text = reply_code, reply_text
        self.exchange, self.routing_key = exchange, routing_key


class Nacked(Exception):
    """RabbitMQ refused a message (`basic.nack`): a queue it was routed to could not take it."""


class ConfirmTimeout(Exception):
    """A confirm did not come within RELAY_RABBITMQ_CONFIRM_TIMEOUT_MS."""


class Channel(Protocol):
    """What the sender uses of a pika channel (a fake in the unit tests)."""

    def basic_publish(
        self, exchange: str, routing_key: str, body: bytes, properties: Any = None, mandatory: bool = False
    ) -> None: ...


@dataclass(eq=False)
class _Pending:
    """A parcel on the wire: its first delivery tag, the confirms still due, when it was sent."""

    parcel: Parcel
    messages: list[Message]
    first_tag: int
    sent_at: float
    left: int = field(init=False)
    reported: bool = False

    def __post_init__(self) -> None:
        self.left = len(self.messages)


class Sender:
    """The event loop's side: publishes the parcels handed over, in order, and reports each one.
    Every method runs on the event loop's thread; `closer` closes the session's connection."""

    def __init__(
        self,
        reports: queue.SimpleQueue[Report],
        exchange: str,
        confirm_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reports = reports
        self._exchange = exchange
        self._timeout_s = confirm_timeout_s
        self._clock = clock
        self._channel: Channel | None = None
        self._closer: Callable[[], None] = lambda: None
        self._next_tag = 1  # a fresh channel in confirm mode numbers its publishes from 1
        self._unconfirmed: OrderedDict[int, _Pending] = OrderedDict()  # tag -> its parcel, in tag order
        self._stopped: BaseException | None = None
        self.blocked: str | None = None  # why the server blocked the connection (a resource alarm), if it did

    def start(self, channel: Channel, closer: Callable[[], None]) -> None:
        self._channel, self._closer = channel, closer

    @property
    def stopped(self) -> bool:
        """Whether a failure (or `close`) stopped it: nothing more goes on the wire."""
        return self._stopped is not None

    def hand(self, parcel: Parcel, messages: list[Message], publish_by: float | None) -> None:
        """Publish `parcel`'s messages now, unless the session stopped or its lease ran out."""
        if self._stopped is not None:
            self._report(parcel, messages, Unsent(f"not sent after an earlier failure: {self._stopped}"))
        elif publish_by is not None and self._clock() >= publish_by:
            late = LeaseNotHeld("the lease was no longer provably held when it was to be sent")
            self._stop(late)
            self._report(parcel, messages, late)
        else:
            self._publish(parcel, messages)

    def _publish(self, parcel: Parcel, messages: list[Message]) -> None:
        assert self._channel is not None, "started"
        pending = _Pending(parcel, messages, self._next_tag, self._clock())
        for i, (routing_key, body, properties) in enumerate(messages):
            try:
                self._channel.basic_publish(self._exchange, routing_key, body, properties, mandatory=True)
            except Exception as exc:  # noqa: BLE001 - any failure to put a message on the wire fails the parcel
                self._fail(pending, exc, at=i)
                self._stop(exc, close=True)
                return
            self._unconfirmed[self._next_tag] = pending
            self._next_tag += 1

    # ---- what the server answers ----------------------------------------------------------------

    def on_confirm(self, frame: Any) -> None:
        """A `basic.ack` or `basic.nack` (pika's confirm callback) for one delivery tag, or with
        `multiple` for every tag up to it."""
        method = frame.method
        nack = isinstance(method, spec.Basic.Nack)
        for tag in self._tags(method.delivery_tag, method.multiple):
            pending = self._unconfirmed.pop(tag)
            if pending.reported:
                continue
            if nack:
                self._fail(pending, Nacked("RabbitMQ refused it (basic.nack)"), at=tag - pending.first_tag)
                self._stop(Nacked("a message was refused (basic.nack)"))
                continue
            pending.left -= 1
            if pending.left == 0:
                pending.reported = True
                self._reports.put((pending.parcel, len(pending.messages), None))

    def _tags(self, tag: int, multiple: bool) -> list[int]:
        if not multiple:
            return [tag] if tag in self._unconfirmed else []
        tags = []
        for t in self._unconfirmed:
            if t > tag:
                break
            tags.append(t)
        return tags

    def on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        """A `basic.return` (pika's return callback): the message with this `message_id` was
        unroutable. It comes before that message's confirm; its parcel fails at it."""
        returned = Returned(method.reply_code, method.reply_text, method.exchange, method.routing_key)
        for pending in self._unconfirmed.values():
            at = next((i for i, m in enumerate(pending.messages) if m[2].message_id == properties.message_id), None)
            if at is not None and not pending.reported:
                self._fail(pending, returned, at=at)
                break
        self._stop(returned)

    def on_closed(self, reason: BaseException) -> None:
        """The channel or the connection closed: every parcel in flight fails with `reason`."""
        self._stop(reason)
        self._fail_all(reason)

    def on_blocked(self, reason: str | None) -> None:
        """The server blocked (a reason) or unblocked (None) the connection's publishing."""
        self.blocked = reason

    def check_confirms(self) -> None:
        """Fail everything in flight when the oldest unconfirmed message waited longer than
        RELAY_RABBITMQ_CONFIRM_TIMEOUT_MS (called periodically)."""
        oldest = next(iter(self._unconfirmed.values()), None)
        if oldest is None or self._clock() - oldest.sent_at < self._timeout_s:
            return
        blocked = f" (the server blocked the connection: {self.blocked})" if self.blocked else ""
        late = ConfirmTimeout(f"no publisher confirm from RabbitMQ within {self._timeout_s:g} s{blocked}")
        self._stop(late, close=True)
        self._fail_all(late)

    # ---- failures -------------------------------------------------------------------------------

    def _fail_all(self, reason: BaseException) -> None:
        """Fail every parcel in flight at its first unconfirmed message (or at the message whose size
        RabbitMQ named, when it closed the channel over one too large)."""
        size = _too_large(reason)
        for tag, pending in self._unconfirmed.items():
            if not pending.reported:
                at = next((i for i, m in enumerate(pending.messages) if len(m[1]) == size), tag - pending.first_tag)
                self._fail(pending, reason, at=at)
        self._unconfirmed.clear()

    def _fail(self, pending: _Pending, error: BaseException, at: int) -> None:
        pending.reported = True
        self._report(pending.parcel, pending.messages, error, at)

    def _report(self, parcel: Parcel, messages: list[Message], error: BaseException, at: int = 0) -> None:
        self._reports.put((parcel, len(messages), (messages[at][1] if messages else b"", error)))

    def _stop(self, error: BaseException, close: bool = False) -> None:
        """The first failure: nothing more goes on the wire (`close`: the connection closes too)."""
        if self._stopped is None:
            self._stopped = error
        if close:
            self._closer()

    def close(self) -> None:
        self._stop(Unsent("the publisher was closed"), close=True)


def _too_large(reason: BaseException) -> int | None:
    """The size RabbitMQ named when it closed the channel over a message above max_message_size."""
    if isinstance(reason, ChannelClosed) and reason.reply_code == PRECONDITION_FAILED:
        found = _TOO_LARGE.search(reason.reply_text)
        return int(found.group(1)) if found else None
    return None


class RabbitPublisher(HandOverPublisher[Message]):
    """The loop's side of one session's publishing (relay.core.boundaries.Publisher, through
    relay.core.handover). Every method runs on the loop's thread. `dead_letter` is the dead-letter
    routing key when poison events are dead-lettered (a return of it is the operator's to fix:
    nothing is bound for it); `close` closes the session's connection."""

    def __init__(
        self,
        thread: EventLoopThread,
        sender: Sender,
        reports: queue.SimpleQueue[Report],
        frame_max: int,
        dead_letter: str | None,
        close: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(reports, lambda parcel, messages, by: thread.call(sender.hand, parcel, messages, by))
        self._frame_max = frame_max
        self._dead_letter = dead_letter
        self._close = close

    def converter(self) -> Callable[[OutgoingMessage], Message]:
        """A parcel's messages as AMQP's, stamped with the time it is handed over."""
        now = int(time.time())
        return lambda m: to_amqp(m, now, self._frame_max)

    def broker_failure(self, parcel: Parcel, event_id: str, error: BaseException) -> Exception:
        if isinstance(error, Returned):
            return self._returned(event_id, error)
        if isinstance(error, (ChannelClosed, ConnectionClosed)):
            return self._closed(event_id, parcel, error)
        return DeliveryError(event_id, f"RabbitMQ: {describe(error)}")

    def _returned(self, event_id: str, error: Returned) -> Exception:
        where = f"exchange {error.exchange} has no queue bound for routing key {error.routing_key}"
        if error.routing_key == self._dead_letter:
            return ConfigError(
                env_name("dead_letter_topic"),
                f"RabbitMQ returned the dead letter of event {event_id} unroutable: {where}; bind a queue for it",
            )
        return PoisonEventError(event_id, f"RabbitMQ returned it unroutable ({error}): {where}")

    def _closed(self, event_id: str, parcel: Parcel, error: ChannelClosed | ConnectionClosed) -> Exception:
        if isinstance(error, ChannelClosed) and error.reply_code == ACCESS_REFUSED:
            return ServerRefusedError(f"RabbitMQ refused to take event {event_id}: {describe(error)}")
        size = _too_large(error)
        if size is not None and any(len(m.value) == size and m.event_id == event_id for m in parcel.messages):
            return PoisonEventError(event_id, f"RabbitMQ refused it: {error.reply_text} (max_message_size)")
        return DeliveryError(event_id, f"RabbitMQ: {describe(error)}")

    def close(self) -> None:
        """Stop the sender and close the connection: what is in flight is dropped (nothing of it
        was stored as a position)."""
        with contextlib.suppress(Exception):
            self._close()

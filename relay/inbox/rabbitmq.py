"""The inbox on a RabbitMQ queue (`Inbox.run(..., topics=[QUEUE], rabbitmq_url=...)`): a consumer
of one queue that hands out batches and acknowledges what was applied, and the dead-letter
publisher.

Contracts, the Kafka consumer's (relay.inbox.consumer) in AMQP's terms:
- `topics` is one queue; `group_id` names the inbox records (as on Kafka), not a RabbitMQ object.
  The queue is the consumer's side: the inbox consumes an existing one as it is (the operator's),
  or, given `rabbitmq_bindings`, declares it when missing (durable, a quorum queue with
  `x-single-active-consumer`) and binds it to `rabbitmq_exchange` with those routing keys, so a
  service that owns its queue needs no operator step (the relay itself never declares a queue).
  A queue that exists is checked by declaring it with those two arguments: RabbitMQ refuses a
  declaration that differs (406), and one WARNING line then says that the queue is not a quorum
  queue with a single active consumer (or that the check could not tell): one inbox process on
  it keeps the order, several would share its messages.
- Acknowledgement is the offset commit: `commit` sends `basic.ack` with `multiple` for the newest
  delivery tag the batch's MongoDB transaction recorded (every earlier delivery with it), after
  that transaction committed. AMQP does not confirm an ack: one lost with the connection means
  the messages are delivered again, and the inbox skips the events its records hold.
- Order per aggregate survives a consumer's death: the prefetch (`basic.qos`) is the batch limit,
  so a batch's messages are all the consumer holds unacknowledged; when its connection ends,
  RabbitMQ returns them to the queue ahead of the rest, and the next consumer (the single active
  one) gets them again first.
- A connection lost under a running inbox (a broker restart) is opened again by the next
  `gather`, tried until `connect_timeout_s`; deliveries of the old channel are dropped (RabbitMQ
  delivers them again), and a batch gathered there is not acknowledged on the new one.
- `lags()`: the queue's ready messages (a passive declare), asked every few seconds.

Every call runs on an event loop thread of its own (pika's asyncio adapter, relay.rabbitmq.client,
as the relay's publisher): the connection's heartbeats go on while a batch is applied. Both inboxes
use this source through blocking calls, the async one from its consumer thread as with Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pika import BasicProperties, DeliveryMode, spec
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.channel import Channel
from pika.exceptions import ChannelClosed

from relay.core.errors import ConfigError
from relay.core.message import HEADER_AGGREGATE_ID
from relay.inbox.batching import BatchLimits, Gathering, Poisoned
from relay.inbox.config import RunOptions
from relay.inbox.consumer import Received, Stopping
from relay.inbox.poison import dead_letter
from relay.loop_thread import EventLoopThread
from relay.rabbitmq.client import channel, close, connect, ensure_exchange, rpc
from relay.rabbitmq.errors import NOT_FOUND, PRECONDITION_FAILED, describe

log = logging.getLogger("relay.inbox")

_CALL_S = 60.0  # longest one call may take on the event loop (a gather waits far less)
_ASK_S = 5.0
_LAG_EVERY_S = 5.0
# What an inbox's queue is declared with, and checked for when it exists.
QUEUE_ARGUMENTS = {"x-queue-type": "quorum", "x-single-active-consumer": True}
_INEQUIVALENT = re.compile(r"inequivalent arg '([^']+)'")


def received(method: Any, properties: Any, body: bytes) -> Received:
    """An AMQP delivery as the inbox's steps take it: the routing key as the topic (the relay's
    topic), partition 0 (one queue keeps one order), the delivery tag as the offset (the channel's
    count, what `basic.ack` names), the aggregate id header as the key."""
    headers = [(str(k), _text(v)) for k, v in (properties.headers or {}).items()]
    key = dict(headers).get(HEADER_AGGREGATE_ID)
    return Received(
        method.routing_key, 0, method.delivery_tag, key.encode() if isinstance(key, str) else key, body, headers
    )


def _text(value: Any) -> str | bytes | None:
    """A header value as the decoder reads it: text as it is, bytes unchanged, anything else as text."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else str(value)


@dataclass(eq=False)
class _Session:
    """One connection and its consuming channel; the deliveries it received, not yet gathered."""

    connection: AsyncioConnection
    channel: Channel | None = None
    deliveries: asyncio.Queue[Received | None] = field(default_factory=asyncio.Queue)
    lost: BaseException | None = None

    @property
    def open(self) -> bool:
        return self.lost is None and self.channel is not None and self.channel.is_open

    def closed(self, reason: BaseException) -> None:
        """The channel or connection closed: a gather waiting wakes up."""
        if self.lost is None:
            self.lost = reason
            self.deliveries.put_nowait(None)


class RabbitSource:
    """The inbox's consumer of its queue: `gather` a batch, `commit` it, `close` on the way out."""

    def __init__(self, options: RunOptions) -> None:
        self._options = options
        self._config = options.rabbitmq_config()
        [self._queue] = options.topics
        self._thread = EventLoopThread(f"relay-inbox-rabbitmq-{options.group_id}")
        self._gathered_from: _Session | None = None
        self._lags: dict[tuple[str, int], int] = {}
        self._lags_at = 0.0
        try:
            self._session = self._thread.run(self._open(check=True), _CALL_S)
        except BaseException:
            self._thread.close()
            raise

    async def _open(self, check: bool) -> _Session:
        """A connection consuming the queue (made sure of first when `check`)."""
        # `session` is bound once connected, before the connection can close.
        session = _Session(await connect(self._config, on_closed=lambda reason: session.closed(reason)))  # noqa: PLW0108
        try:
            if check:
                await self._make_sure_of_queue(session.connection)
            ch = await channel(session.connection, on_closed=lambda _ch, reason: session.closed(reason))
            await rpc(ch, ch.basic_qos, prefetch_count=self._options.batch_max_events)
            await rpc(ch, ch.basic_consume, queue=self._queue, on_message_callback=self._on_message(session))
            session.channel = ch
        except ChannelClosed as exc:
            close(session.connection)
            if exc.reply_code == NOT_FOUND:
                raise self._missing() from exc
            raise
        except BaseException:
            close(session.connection)
            raise
        return session

    def _on_message(self, session: _Session) -> Any:
        def delivered(_ch: Channel, method: Any, properties: Any, body: bytes) -> None:
            session.deliveries.put_nowait(received(method, properties, body))

        return delivered

    async def _make_sure_of_queue(self, connection: AsyncioConnection) -> None:
        """The queue exists (declared and bound with `rabbitmq_bindings` when missing), or
        ConfigError naming `topics`; one WARNING when it is not, or cannot be told to be, a quorum
        queue with a single active consumer."""
        o = self._options
        ch = await channel(connection)
        try:
            await rpc(ch, ch.queue_declare, queue=self._queue, passive=True)
        except ChannelClosed as exc:
            if exc.reply_code != NOT_FOUND or not o.rabbitmq_bindings:
                raise
        _close_channel(ch)
        if o.rabbitmq_bindings:
            await ensure_exchange(connection, o.rabbitmq_exchange)
        ch = await channel(connection)
        try:
            await rpc(ch, ch.queue_declare, queue=self._queue, durable=True, arguments=QUEUE_ARGUMENTS)
        except ChannelClosed as exc:  # it exists, declared otherwise (or the user may not declare it)
            _warn_queue_kind(self._queue, exc)
            ch = await channel(connection)
        for key in o.rabbitmq_bindings:
            await rpc(ch, ch.queue_bind, queue=self._queue, exchange=o.rabbitmq_exchange, routing_key=key)
        if o.rabbitmq_bindings:
            log.info("queue %s bound to exchange %s with %s", self._queue, o.rabbitmq_exchange,
                     ", ".join(o.rabbitmq_bindings))  # fmt: skip
        _close_channel(ch)

    def _missing(self) -> ConfigError:
        return ConfigError(
            "topics",
            f"RabbitMQ at {self._config.url} has no queue {self._queue}: declare it (a quorum queue with "
            f"x-single-active-consumer, bound to exchange {self._options.rabbitmq_exchange}) or pass "
            "rabbitmq_bindings=[routing keys] for the inbox to declare and bind it",
        )

    def gather(self, limits: BatchLimits, stop: Stopping) -> list[Received]:
        """The next batch, in delivery order; [] after an idle poll or when `stop` is set first
        (closes at `limits` or at the first poll that returns nothing: batching.Gathering). A lost
        connection is opened again first."""
        return list(self._thread.run(self._gather(limits, stop), _CALL_S + self._config.connect_timeout_s))

    async def _gather(self, limits: BatchLimits, stop: Stopping) -> list[Received]:
        if not self._session.open:
            log.warning("RabbitMQ connection lost (%s): connecting again", describe(self._session.lost or
                        ConnectionError("channel closed")))  # fmt: skip
            close(self._session.connection)
            self._session = await self._open(check=False)
        session = self._gathered_from = self._session
        batch: list[Received] = []
        gathering = Gathering(limits, self._options.poll_timeout_s)
        while not stop.is_set() and session.open:
            timeout = gathering.wait(len(batch), time.monotonic())
            if timeout is None:
                break
            got = await _take(session.deliveries, limits.room(len(batch)), timeout)
            batch += got
            if not gathering.polled(len(batch), len(got), time.monotonic()):
                break
        return batch

    def commit(self, offsets: dict[tuple[str, int], int]) -> bool:
        """Acknowledge every delivery up to the newest that `offsets` (next delivery tag, per
        routing key) covers; False when the channel the batch came on is gone (its messages are
        delivered again, and skipped)."""
        if not offsets:
            return True
        newest = max(offsets.values()) - 1
        session = self._gathered_from
        if session is None or not session.open or session is not self._session:
            log.warning("acknowledgement not sent: the channel the batch came on closed (redelivered events will "
                        "be skipped)")  # fmt: skip
            return False
        try:
            self._thread.run(_ack(session, newest), _ASK_S)
        except Exception as exc:  # noqa: BLE001 - redelivered events are skipped: log and go on
            log.warning("acknowledgement failed (redelivered events will be skipped): %s", describe(exc),
                        extra={"cause": str(exc)})  # fmt: skip
            return False
        return True

    def lags(self) -> dict[tuple[str, int], int]:
        """(queue, 0) -> messages ready in the queue."""
        now = time.monotonic()
        if now - self._lags_at >= _LAG_EVERY_S and self._session.open:
            self._lags_at = now
            try:
                ready = self._thread.run(self._ready(), _ASK_S * 2)
                self._lags = {(self._queue, 0): ready}
            except Exception as exc:  # noqa: BLE001 - the lag series waits for the next answer
                log.debug("queue size unknown: %s", exc)
        return dict(self._lags)

    async def _ready(self) -> int:
        """The queue's ready messages (a passive declare on the consuming channel, answered or not)."""
        assert self._session.channel is not None
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._session.channel.queue_declare(self._queue, passive=True, callback=answer.set_result)
        return int((await asyncio.wait_for(answer, _ASK_S)).method.message_count)

    def close(self) -> None:
        """Close the connection: what was delivered and not acknowledged goes back to the queue."""
        try:
            self._thread.run(_closed(self._session.connection), _ASK_S * 2)
        except Exception as exc:  # noqa: BLE001 - closing: nothing else to do
            log.debug("closing the RabbitMQ connection: %s", exc)
        finally:
            self._thread.close()


async def _take(deliveries: asyncio.Queue[Received | None], room: int, timeout: float) -> list[Received]:
    """Up to `room` deliveries: waits up to `timeout` for the first, takes the others at hand;
    fewer when the channel closed (its marker is left for the next gather)."""
    got: list[Received] = []
    try:
        first = await asyncio.wait_for(deliveries.get(), max(timeout, 0.01))
    except TimeoutError:
        return got
    item: Received | None = first
    while item is not None:
        got.append(item)
        if len(got) >= room or deliveries.empty():
            return got
        item = deliveries.get_nowait()
    deliveries.put_nowait(None)
    return got


async def _ack(session: _Session, tag: int) -> None:
    """`basic.ack` of every delivery up to `tag` (on the event loop, where the channel lives)."""
    assert session.channel is not None
    session.channel.basic_ack(delivery_tag=tag, multiple=True)


async def _closed(connection: AsyncioConnection) -> None:
    """Close `connection` and wait (briefly) until it is closed."""
    close(connection)
    deadline = time.monotonic() + _ASK_S
    while not connection.is_closed and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _close_channel(ch: Channel) -> None:
    if ch.is_open:
        ch.close()


def _warn_queue_kind(queue: str, refusal: ChannelClosed) -> None:
    """One WARNING when declaring `queue` as the inbox would was refused: it is not a quorum queue
    with a single active consumer, or (another argument differs; no configure permission) that
    could not be told."""
    found = _INEQUIVALENT.search(refusal.reply_text)
    if refusal.reply_code == PRECONDITION_FAILED and found and found.group(1) in QUEUE_ARGUMENTS:
        log.warning(
            "queue %s is not a quorum queue with x-single-active-consumer (RabbitMQ: %s): run one inbox process on "
            "it; several would share its messages and break the order per aggregate",
            queue,
            refusal.reply_text,
        )
    else:
        log.warning(
            "could not check that queue %s is a quorum queue with x-single-active-consumer (RabbitMQ: %s): unless "
            "it is, run one inbox process on it",
            queue,
            describe(refusal),
        )


class RabbitDeadLetters:
    """Publishes a poison message to `rabbitmq_exchange` with the dead-letter routing key
    (`dead_letter_topic`), mandatory, and waits for RabbitMQ's confirm: its body and headers as
    they were, with the reason and where it came from. A dead letter no queue takes is an error
    naming the routing key (bind a queue for it)."""

    def __init__(self, options: RunOptions) -> None:
        self._options = options
        self._config = options.rabbitmq_config()
        self._thread = EventLoopThread(f"relay-inbox-rabbitmq-dead-letters-{options.group_id}")
        self._connection: AsyncioConnection | None = None
        self._channel: Channel | None = None
        self._tag = 0
        self._pending: dict[int, asyncio.Future[None]] = {}
        try:
            self._thread.run(self._open(), _CALL_S)
        except BaseException:
            self._thread.close()
            raise

    async def _open(self) -> None:
        self._connection = await connect(self._config)
        ch = await channel(self._connection, on_closed=lambda _ch, reason: self._fail_all(reason))
        await rpc(ch, ch.confirm_delivery, ack_nack_callback=self._on_confirm)
        ch.add_on_return_callback(self._on_return)
        self._channel, self._tag = ch, 0

    def send(self, poisoned: Poisoned, msg: Received) -> None:
        """Returns once RabbitMQ confirmed the dead letter; raises otherwise."""
        o = self._options
        record = dead_letter(poisoned, o.dead_letter_topic, o.group_id, msg.key, msg.value, list(msg.raw_headers))
        headers = {k: _header(v) for k, v in record.headers}
        properties = BasicProperties(
            content_type=str(headers.get("content-type")) if headers.get("content-type") else None,
            delivery_mode=DeliveryMode.Persistent.value,
            headers=headers,
            message_id=poisoned.event_id,
            timestamp=int(time.time()),
        )
        self._thread.run(self._publish(record.topic, record.value or b"", properties), _CALL_S)

    async def _publish(self, routing_key: str, body: bytes, properties: BasicProperties) -> None:
        if self._channel is None or not self._channel.is_open:
            if self._connection is not None:
                close(self._connection)
            await self._open()
        assert self._channel is not None
        self._tag += 1
        confirmed = self._pending[self._tag] = asyncio.get_running_loop().create_future()
        self._channel.basic_publish(self._options.rabbitmq_exchange, routing_key, body, properties, mandatory=True)
        await asyncio.wait_for(confirmed, self._config.confirm_timeout_s)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = [t for t in self._pending if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        for tag in tags:
            future = self._pending.pop(tag, None)
            if future is None or future.done():
                continue
            if isinstance(method, spec.Basic.Nack):
                future.set_exception(ConnectionError("RabbitMQ refused the dead letter (basic.nack)"))
            else:
                future.set_result(None)

    def _on_return(self, _ch: Channel, method: Any, _properties: Any, _body: bytes) -> None:
        """No queue took the dead letter: its publish fails (the return comes before its ack)."""
        error = ConfigError(
            "dead_letter_topic",
            f"RabbitMQ returned a dead letter unroutable ({method.reply_text}): exchange {method.exchange} has no "
            f"queue bound for routing key {method.routing_key}; bind a queue for it",
        )
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)

    def _fail_all(self, reason: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(reason)
        self._pending.clear()

    def close(self) -> None:
        try:
            if self._connection is not None:
                self._thread.run(_closed(self._connection), _ASK_S * 2)
        except Exception as exc:  # noqa: BLE001 - closing: nothing else to do
            log.debug("closing the RabbitMQ connection: %s", exc)
        finally:
            self._thread.close()


def _header(value: str | bytes | None) -> str | bytes | None:
    """A header value as the relay publishes it: UTF-8 as a string, other bytes as a byte array."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    return value

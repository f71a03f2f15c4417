"""RabbitMQ as the process's broker (relay.core.boundaries.Broker: `RabbitMQ`, with the one event
loop pika runs on) and each lease's DeliveryMode (`RabbitMode`).

Each leading session gets a fresh connection, a channel in confirm mode and a publisher
(relay.rabbitmq.publisher). RabbitMQ holds no position of the relay's (no offsets record): a new
session resumes from the MongoDB checkpoint alone. Only at-least-once: RELAY_DELIVERY=exactly-once
is refused at start, with the reason (`check_settings`; docs/rabbitmq.md, "Exactly-once").

Every message goes to one exchange (RELAY_RABBITMQ_EXCHANGE, a durable topic exchange, declared
at start and by each session when missing) with the topic as its routing key; the queues and their
bindings are the operator's and the consumers' (the relay never declares or binds one).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable

from pika.adapters.asyncio_connection import AsyncioConnection

from relay.core.boundaries import Publisher
from relay.core.errors import Action, ConfigError, ServerError, ServerUnreachableError
from relay.core.handover import Report
from relay.core.names import env_name
from relay.core.positions import Grant
from relay.loop_thread import EventLoopThread
from relay.rabbitmq import errors
from relay.rabbitmq.client import channel, close, connect, ensure_exchange, rpc
from relay.rabbitmq.config import NO_EXACTLY_ONCE, RabbitConfig
from relay.rabbitmq.publisher import RabbitPublisher, Sender

Heartbeat = Callable[[], None]
_SESSION_CONNECT_S = 5.0  # a session's connection, while it holds the lease (a failure restarts it)
_CLOSE_TIMEOUT_S = 5.0


class RabbitMQ:
    """RELAY_BROKER=rabbitmq for one process: one event loop thread for every connection, the
    start-up checks (the delivery mode, the server, the exchange), and each lease's delivery mode
    (`mode`). `dead_letter` is the dead-letter routing key when poison events go there. `close()`
    when the process ends."""

    name = "rabbitmq"

    def __init__(self, config: RabbitConfig, dead_letter: str | None) -> None:
        self.config = config
        self.thread = EventLoopThread("rabbitmq")
        self._dead_letter = dead_letter

    def check_settings(self) -> None:
        """RELAY_DELIVERY=exactly-once is refused: one line saying why and what to use."""
        if self.config.exactly_once:
            raise ConfigError(env_name("delivery"), NO_EXACTLY_ONCE)

    def check_servers(self) -> None:
        """The server answers (waiting up to RELAY_CONNECT_TIMEOUT_S) and takes the credentials; the
        exchange is a durable topic exchange, declared if missing (relay.rabbitmq.client)."""

        async def checked() -> None:
            connection = await connect(self.config)
            try:
                await ensure_exchange(connection, self.config.exchange)
            finally:
                close(connection)

        self.thread.run(checked(), self.config.connect_timeout_s + 30)

    def mode(self, lease_id: str, fingerprint: str) -> RabbitMode:
        """Every lease's mode is the same: a fresh connection per session."""
        return RabbitMode(self)

    def action_for(self, exc: BaseException) -> Action | None:
        return errors.action_for(exc)

    def publisher(self) -> RabbitPublisher:
        """A fresh connection, confirm channel and publisher for one session; ServerError (a
        restart) when RabbitMQ does not answer now."""
        reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        try:
            sender, connection, gone = self.thread.run(self._session(reports), _SESSION_CONNECT_S * 3)
        except (ServerUnreachableError, TimeoutError) as exc:
            raise ServerError(str(exc)) from exc

        async def closed() -> None:
            sender.close()
            await asyncio.wait_for(gone.wait(), _CLOSE_TIMEOUT_S)

        return RabbitPublisher(
            self.thread,
            sender,
            reports,
            connection.params.frame_max,
            self._dead_letter,
            close=lambda: self.thread.run(closed(), _CLOSE_TIMEOUT_S * 2),
        )

    async def _session(self, reports: queue.SimpleQueue[Report]) -> tuple[Sender, AsyncioConnection, asyncio.Event]:
        """A session's sender on a fresh connection and channel: confirms and returns go to it, and
        it checks its confirms' age every so often until it stops."""
        config = self.config
        sender = Sender(reports, config.exchange, config.confirm_timeout_s)
        gone = asyncio.Event()

        def closed(reason: BaseException) -> None:
            sender.on_closed(reason)
            gone.set()

        connection = await connect(config, _SESSION_CONNECT_S, on_closed=closed)
        try:
            await ensure_exchange(connection, config.exchange)  # deleted under a running relay: again
            ch = await channel(connection, on_closed=lambda _ch, reason: sender.on_closed(reason))
            await rpc(ch, ch.confirm_delivery, ack_nack_callback=sender.on_confirm)
            ch.add_on_return_callback(sender.on_return)
            connection.add_on_connection_blocked_callback(lambda _c, frame: sender.on_blocked(frame.method.reason))
            connection.add_on_connection_unblocked_callback(lambda _c, _frame: sender.on_blocked(None))
        except BaseException:
            close(connection)
            raise
        sender.start(ch, lambda: close(connection))
        _watch(sender, min(1.0, config.confirm_timeout_s / 4))
        return sender, connection, gone

    def close(self) -> None:
        self.thread.close()


def _watch(sender: Sender, every_s: float) -> None:
    """Call `sender.check_confirms()` every `every_s` seconds on the running loop until it stops."""
    loop = asyncio.get_running_loop()

    def tick() -> None:
        sender.check_confirms()
        if not sender.stopped:
            loop.call_later(every_s, tick)

    loop.call_later(every_s, tick)


class RabbitMode:
    """RELAY_DELIVERY=at-least-once on RabbitMQ (relay.core.boundaries.DeliveryMode)."""

    def __init__(self, rabbitmq: RabbitMQ) -> None:
        self._rabbitmq = rabbitmq
        self.name = rabbitmq.config.delivery

    @property
    def offsets_topic(self) -> str:
        """No offsets record on RabbitMQ (named in no error)."""
        return ""

    def start(self, grant: Grant, heartbeat: Heartbeat) -> Publisher:
        return self._rabbitmq.publisher()

    def committed_record(self, heartbeat: Heartbeat) -> None:
        """RabbitMQ holds no position of the relay's: the MongoDB checkpoint alone decides."""
        return None

    def forget(self, publisher: Publisher, heartbeat: Heartbeat) -> None:
        """Never asked: there is no offsets record to forget."""
        raise AssertionError("a RabbitMQ relay writes no offsets record")

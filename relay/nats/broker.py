"""NATS JetStream as the process's broker (relay.core.boundaries.Broker: `JetStream`, with the one
event loop of the nats-py client) and each lease's DeliveryMode (`JetStreamMode`), in both
delivery modes.

Each leading session gets a fresh connection and publisher (relay.nats.publisher). JetStream holds
no checkpoint of the relay's (no offsets record): a new session resumes from the MongoDB checkpoint
alone. The two modes publish the same way, every message with `Nats-Msg-Id` = its event id; what
makes exactly-once is the stream's duplicate window, which drops the copies a crash, a takeover or
a failed acknowledgement makes the relay publish again: at start (`JetStream.check`) the relay
refuses a window shorter than the longest republish it can cause (`longest_republish_s`).

The subjects the relay publishes are what the topic templates give (relay.nats.subjects): the
stream must store them, and the dead-letter subject when poison events are dead-lettered.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence

from relay.core.boundaries import Publisher
from relay.core.config import LoopConfig
from relay.core.errors import Action, ServerError, ServerUnreachableError
from relay.core.handover import Report
from relay.core.positions import Grant
from relay.loop_thread import EventLoopThread
from relay.nats import errors
from relay.nats.client import connect
from relay.nats.config import NatsConfig
from relay.nats.publisher import JetStreamPublisher, Sender
from relay.nats.stream import ensure_stream, stream_storing
from relay.nats.subjects import pattern_of

Heartbeat = Callable[[], None]
_SESSION_CONNECT_S = 5.0  # a session's connection, while it holds the lease (a failure restarts it)


def longest_republish_s(loop: LoopConfig, nats: NatsConfig) -> float:
    """How long after its first publish an event can be published again (docs/nats.md): what was
    delivered but not stored when a relay died (RELAY_CHECKPOINT_INTERVAL_MS), the lease running out
    (RELAY_LEASE_TTL_S) and a standby noticing (RELAY_STANDBY_POLL_S) before its successor publishes
    it again; or a session that waited RELAY_NATS_ACK_TIMEOUT_MS for an acknowledgement, which also
    covers a successor's start."""
    return (
        loop.checkpoint_interval_ms / 1000 + loop.timing.lease_ttl_s + loop.timing.standby_poll_s + nats.ack_timeout_s
    )


class JetStream:
    """RELAY_BROKER=nats for one process: one event loop thread for every connection, the start-up
    check of the stream, and each lease's delivery mode (`mode`). `templates` are the topic
    templates of the process's outboxes (their database and collection filled in),
    `dead_letter` the dead-letter subject when poison events go there; `loop` gives the timing the
    exactly-once check needs. `close()` when the process ends."""

    name = "nats"

    def __init__(self, config: NatsConfig, loop: LoopConfig, templates: Sequence[str], dead_letter: str | None) -> None:
        self.config = config
        self.thread = EventLoopThread("nats")
        self._republish_s = longest_republish_s(loop, config) if config.exactly_once else None
        fixed = [dead_letter] if dead_letter else []
        self.subjects = list(dict.fromkeys([*(pattern_of(t) for t in templates), *fixed]))
        self._creating = list(dict.fromkeys([*(pattern_of(t, ">") for t in templates), *fixed]))

    def check_settings(self) -> None:
        """Nothing to check before the servers: RELAY_NATS_* were checked when read."""

    def check_servers(self) -> None:
        """The servers answer (waiting up to RELAY_CONNECT_TIMEOUT_S) and take the credentials;
        the stream is there and fit, or created (relay.nats.stream)."""

        async def checked() -> None:
            connection = await connect(self.config)
            try:
                await ensure_stream(connection, self.config, self.subjects, self._creating, self._republish_s)
            finally:
                await connection.close()

        self.thread.run(checked(), self.config.connect_timeout_s + 30)

    def mode(self, lease_id: str, fingerprint: str) -> JetStreamMode:
        """Every lease's mode is the same: a fresh connection per session."""
        return JetStreamMode(self)

    def action_for(self, exc: BaseException) -> Action | None:
        return errors.action_for(exc)

    def stream_of(self, subject: str) -> str | None:
        """The stream storing `subject` (None: none), on a connection of its own."""

        async def ask() -> str | None:
            connection = await connect(self.config, _SESSION_CONNECT_S)
            try:
                return await stream_storing(connection, subject)
            finally:
                await connection.close()

        return self.thread.run(ask(), _SESSION_CONNECT_S * 2)

    def publisher(self) -> JetStreamPublisher:
        """A fresh connection and publisher for one session; ServerError (a restart) when NATS
        does not answer now."""
        reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        config = self.config

        async def opened() -> tuple[Sender, int]:
            sender = Sender(reports, config.ack_timeout_s)
            connection = await connect(config, _SESSION_CONNECT_S, closed_cb=sender.on_closed)
            sender.start(connection)
            return sender, connection.max_payload

        try:
            sender, max_payload = self.thread.run(opened(), _SESSION_CONNECT_S * 2)
        except (ServerUnreachableError, TimeoutError) as exc:
            raise ServerError(str(exc)) from exc
        return JetStreamPublisher(self.thread, sender, reports, max_payload, self.stream_of)

    def close(self) -> None:
        self.thread.close()


class JetStreamMode:
    """RELAY_DELIVERY (either mode) on NATS JetStream (relay.core.boundaries.DeliveryMode)."""

    def __init__(self, jetstream: JetStream) -> None:
        self._jetstream = jetstream
        self.name = jetstream.config.delivery

    @property
    def offsets_topic(self) -> str:
        """No offsets record on NATS (named in no error)."""
        return ""

    def start(self, grant: Grant, heartbeat: Heartbeat) -> Publisher:
        return self._jetstream.publisher()

    def committed_record(self, heartbeat: Heartbeat) -> None:
        """JetStream holds no checkpoint of the relay's: the MongoDB checkpoint alone decides."""
        return None

    def forget(self, publisher: Publisher, heartbeat: Heartbeat) -> None:
        """Never asked: there is no offsets record to forget."""
        raise AssertionError("a JetStream relay writes no offsets record")

"""The inbox on NATS JetStream (`Inbox.run(..., nats_servers=...)`): a durable pull consumer that
hands out batches and acknowledges what was applied, and the dead-letter publisher.

Contracts, the Kafka consumer's (relay.inbox.consumer) in JetStream's terms:
- The durable consumer `group_id` of the stream `nats_stream` reads the subjects `topics`
  (wildcards allowed) in stream order; the inbox creates it when missing (from the first message,
  or from new ones with `auto_offset_reset="latest"`) and refuses one that reads other subjects.
- Acknowledgement is `AckPolicy.ALL`, the offset commit's equivalent: `commit` acknowledges the
  newest message the batch's MongoDB transaction recorded (every earlier one with it), after that
  transaction committed. A failed acknowledgement is logged and ignored: the events stay recorded
  in the inbox, so they are skipped when delivered again.
- Order per aggregate survives a consumer's death: `max_ack_pending` is the batch limit, so while a
  batch is unacknowledged the server delivers nothing newer; once its `ack_wait` ran out it
  delivers that batch again, first. Run one inbox process per durable consumer (several would
  share its messages; JetStream's pinned-client groups are not in nats-py 2.16).
- `lags()`: the consumer's pending count (messages not yet delivered), asked every few seconds.

Every call runs on an event loop thread of its own (nats-py is asyncio only): both inboxes use
this source through blocking calls, the async one from its consumer thread as with Kafka.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from relay.core.errors import ConfigError
from relay.core.message import HEADER_AGGREGATE_ID
from relay.core.redact import Secret, Uri
from relay.inbox.batching import BatchLimits, Gathering, Poisoned
from relay.inbox.config import RunOptions
from relay.inbox.consumer import Received, Stopping
from relay.inbox.poison import dead_letter
from relay.loop_thread import EventLoopThread
from relay.nats.client import connect
from relay.nats.config import NatsConfig

log = logging.getLogger("relay.inbox")

_CALL_S = 60.0  # longest one call may take on the event loop (a gather waits far less)
_ACK_S = 5.0
_LAG_EVERY_S = 5.0


def nats_config(options: RunOptions) -> NatsConfig:
    """The connection settings of a run's `nats_*` options (the relay's NatsConfig, so its checks)."""
    return NatsConfig(
        servers=Uri(options.nats_servers),
        stream=options.nats_stream,
        creds_file=options.nats_creds,
        user=options.nats_user,
        password=Secret(options.nats_password),
        token=Secret(options.nats_token),
        tls_ca=options.nats_tls_ca,
        create_stream=False,
        ack_timeout_ms=int(_ACK_S * 1000),
        duplicate_window_s=120.0,
        connect_timeout_s=options.connect_timeout_s,
        delivery="at-least-once",
    )


def received(msg: Any) -> Received:
    """A JetStream message as the inbox's steps take it: the subject as the topic, partition 0
    (one stream keeps one order), the stream sequence as the offset, the aggregate id as the key."""
    headers = dict(msg.headers or {})
    key = headers.get(HEADER_AGGREGATE_ID)
    return Received(
        msg.subject, 0, msg.metadata.sequence.stream, key.encode() if key is not None else None, msg.data,
        list(headers.items()),
    )  # fmt: skip


class JetStreamSource:
    """The group's durable pull consumer: `gather` a batch, `commit` it, `close` on the way out."""

    def __init__(self, options: RunOptions) -> None:
        self._options = options
        self._config = nats_config(options)
        self._thread = EventLoopThread(f"relay-inbox-nats-{options.group_id}")
        self._delivered: dict[int, Any] = {}  # stream sequence -> message, until acknowledged
        self._lags: dict[tuple[str, int], int] = {}
        self._lags_at = 0.0
        try:
            self._connection, self._sub = self._thread.run(self._open(), _CALL_S)
        except BaseException:
            self._thread.close()
            raise

    async def _open(self) -> tuple[Any, Any]:
        from nats.js.errors import NotFoundError

        o = self._options
        connection = await connect(self._config)
        js = connection.jetstream()
        try:
            info = await js.consumer_info(o.nats_stream, o.group_id)
            reads = list(
                info.config.filter_subjects or ([info.config.filter_subject] if info.config.filter_subject else [])
            )
            if sorted(reads) != sorted(o.topics):
                raise ConfigError(
                    "topics",
                    f"the durable consumer {o.group_id} of stream {o.nats_stream} reads {', '.join(reads) or 'every subject'}, "
                    f"not {', '.join(o.topics)}: give this inbox another group_id, or delete that consumer",
                )
        except NotFoundError:
            await js.add_consumer(o.nats_stream, self._consumer_config())
            log.info("created durable consumer %s on stream %s for %s", o.group_id, o.nats_stream, ", ".join(o.topics))
        except BaseException:
            await connection.close()
            raise
        return connection, await js.pull_subscribe_bind(durable=o.group_id, stream=o.nats_stream)

    def _consumer_config(self) -> Any:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        o = self._options
        subjects = list(o.topics)
        return ConsumerConfig(
            durable_name=o.group_id,
            filter_subject=subjects[0] if len(subjects) == 1 else None,
            filter_subjects=subjects if len(subjects) > 1 else None,
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.NEW if o.auto_offset_reset == "latest" else DeliverPolicy.ALL,
            max_ack_pending=o.batch_max_events,
            ack_wait=o.ack_wait_s,
        )

    def gather(self, limits: BatchLimits, stop: Stopping) -> list[Received]:
        """The next batch, in stream order; [] after an idle poll or when `stop` is set first
        (closes at `limits` or at the first poll that returns nothing: batching.Gathering)."""
        return list(self._thread.run(self._gather(limits, stop), _CALL_S))

    async def _gather(self, limits: BatchLimits, stop: Stopping) -> list[Received]:
        batch: list[Received] = []
        gathering = Gathering(limits, self._options.poll_timeout_s)
        while not stop.is_set():
            timeout = gathering.wait(len(batch), time.monotonic())
            if timeout is None:
                break
            try:
                messages = await self._sub.fetch(limits.room(len(batch)), timeout=max(timeout, 0.01))
            except TimeoutError:  # nats-py's and asyncio's: nothing to fetch within the wait
                messages = []
            for msg in messages:
                self._delivered[msg.metadata.sequence.stream] = msg
                batch.append(received(msg))
            if not gathering.polled(len(batch), len(messages), time.monotonic()):
                break
        return batch

    def commit(self, offsets: dict[tuple[str, int], int]) -> bool:
        """Acknowledge every message up to the newest that `offsets` (next sequence to read, per
        subject) covers; False if the server did not confirm it."""
        if not offsets:
            return True
        newest = max(offsets.values()) - 1
        msg = self._delivered.get(newest)
        if msg is None:
            return True  # acknowledged already with a later one
        try:
            self._thread.run(msg.ack_sync(timeout=_ACK_S), _ACK_S * 2)
        except Exception as exc:  # noqa: BLE001 - redelivered events are skipped: log and go on
            log.warning(
                "acknowledgement failed (redelivered events will be skipped): %s", exc, extra={"cause": str(exc)}
            )
            return False
        self._delivered = {seq: m for seq, m in self._delivered.items() if seq > newest}
        return True

    def lags(self) -> dict[tuple[str, int], int]:
        """(stream, 0) -> messages of the consumer's subjects not yet delivered."""
        now = time.monotonic()
        if now - self._lags_at >= _LAG_EVERY_S:
            self._lags_at = now
            try:
                info = self._thread.run(self._sub.consumer_info(), _ACK_S)
                self._lags = {(self._options.nats_stream, 0): int(info.num_pending)}
            except Exception as exc:  # noqa: BLE001 - the lag series waits for the next answer
                log.debug("consumer info failed: %s", exc)
        return dict(self._lags)

    def close(self) -> None:
        """Close the connection (the durable consumer stays, with what it acknowledged)."""
        _close(self._thread, self._connection)


class JetStreamDeadLetters:
    """Publishes a poison message to the dead-letter subject (`dead_letter_topic`) and waits for
    JetStream's acknowledgement; its headers as they were, with the reason and where it came from
    (a header NATS cannot carry unchanged is carried as nats-py passes it: trimmed, line breaks as
    spaces)."""

    def __init__(self, options: RunOptions) -> None:
        self._subject = options.dead_letter_topic
        self._group = options.group_id
        self._config = nats_config(options)
        self._thread = EventLoopThread(f"relay-inbox-nats-dead-letters-{options.group_id}")
        try:
            self._connection = self._thread.run(connect(self._config), _CALL_S)
        except BaseException:
            self._thread.close()
            raise

    def send(self, poisoned: Poisoned, msg: Received) -> None:
        """Returns once JetStream stored the dead letter; raises nats-py's error otherwise."""
        record = dead_letter(poisoned, self._subject, self._group, msg.key, msg.value, list(msg.raw_headers))
        headers = {k: v.decode(errors="replace") if isinstance(v, bytes) else str(v) for k, v in record.headers}
        if poisoned.event_id:
            headers["Nats-Msg-Id"] = f"dead-letter-{self._group}-{poisoned.event_id}"
        js = self._connection.jetstream()
        self._thread.run(js.publish(record.topic, record.value or b"", headers=headers, timeout=_ACK_S), _CALL_S)

    def close(self) -> None:
        _close(self._thread, self._connection)


def _close(thread: EventLoopThread, connection: Any) -> None:
    """Close a NATS connection on its event loop's thread, then that thread."""
    try:
        thread.run(connection.close(), _ACK_S)
    except Exception as exc:  # noqa: BLE001 - closing: nothing else to do
        log.debug("closing the NATS connection: %s", exc)
    finally:
        thread.close()

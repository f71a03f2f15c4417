"""One leading session's JetStream publisher (relay.core.boundaries.Publisher): each parcel's
messages published in order on the session's own connection, many acknowledgements in flight, the
parcel reported once JetStream acknowledged every message of it (a PubAck: the stream stored it) or
one of them failed.

Two threads, each piece of state with one owner:

| part | owned by | what it holds |
| --- | --- | --- |
| `JetStreamPublisher` | the loop's thread | what relay.core.handover.HandOverPublisher holds (messages not yet reported, the first failure it took), the server's max_payload |
| `Sender` | the event loop's thread (relay.loop_thread) | the parcels handed over and not yet published (an asyncio queue), the first failure it saw (`_stopped`), the connection |
| `reports` (a `queue.SimpleQueue`) | both: the sender puts `(parcel, count, failure)`, the publisher takes | |

A parcel itself is touched only on the loop's thread: the sender gets its messages as plain tuples
and its deadline as a number, and hands the parcel back untouched in its report.

Rules, each enforced here:
- Messages go on the wire in send order: one sender task takes the parcels in the order they were
  handed over (`EventLoopThread.call` keeps it) and puts every message of one on the wire before
  it takes the next.
- A parcel is reported acknowledged only once every message's PubAck came back without an error;
  a PubAck missing after RELAY_NATS_ACK_TIMEOUT_MS, an error answer or a closed connection fails
  it. A PubAck saying `duplicate` is an acknowledgement: the stream holds the message.
- After the first failure nothing more goes on the wire: the sender stops and closes the
  connection, and every parcel handed over later fails unsent. The loop then publishes again from
  its stored checkpoint on a fresh connection, in order; the stream drops the copies it stored
  within its duplicate window (`Nats-Msg-Id`).
- A parcel whose `publish_by` passed before the sender took it is not sent (its lease was no longer
  provably held: a replica paused there wakes up without publishing it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError

from relay.core.errors import DeliveryError, PoisonEventError, ServerRefusedError
from relay.core.handover import HandOverPublisher, LeaseNotHeld, Report, Unsent
from relay.core.message import OutgoingMessage
from relay.core.window import Parcel
from relay.loop_thread import EventLoopThread
from relay.nats.errors import UNAVAILABLE, describe, refusal_of
from relay.nats.messages import Headers, to_nats

log = logging.getLogger(__name__)

Message = tuple[str, bytes, Headers]
_CLOSE_TIMEOUT_S = 5.0


class Sender:
    """The event loop's side: publishes the parcels handed over, in order, and reports each one.
    Every method runs on the event loop's thread."""

    def __init__(self, reports: queue.SimpleQueue[Report], ack_timeout_s: float) -> None:
        self._reports = reports
        self._ack_timeout_s = ack_timeout_s
        self._parcels: asyncio.Queue[tuple[Parcel, list[Message], float | None]] = asyncio.Queue()
        self._stopped: BaseException | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._connection: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiting: set[asyncio.Task[Any]] = (
            set()
        )  # tasks awaiting PubAcks or a close (held: asyncio keeps weak references)

    def start(self, connection: Client) -> None:
        self._connection = connection
        self._task = asyncio.ensure_future(self._run(connection.jetstream()))

    async def on_closed(self) -> None:
        """The connection closed (the server went away, or `close`): fail what waits for a PubAck."""
        self._stop(ConnectionError("the connection to NATS closed"))

    def hand(self, parcel: Parcel, messages: list[Message], publish_by: float | None) -> None:
        self._parcels.put_nowait((parcel, messages, publish_by))

    async def _run(self, js: JetStreamContext) -> None:
        while True:
            parcel, messages, publish_by = await self._parcels.get()
            if self._stopped is not None:
                self._report(parcel, messages, Unsent(f"not sent after an earlier failure: {self._stopped}"))
            elif publish_by is not None and time.monotonic() >= publish_by:
                late = LeaseNotHeld("the lease was no longer provably held when it was to be sent")
                self._stop(late)
                self._report(parcel, messages, late)
            else:
                await self._publish(js, parcel, messages)

    async def _publish(self, js: JetStreamContext, parcel: Parcel, messages: list[Message]) -> None:
        acks: list[asyncio.Future[Any]] = []
        try:
            for subject, data, headers in messages:
                # wait_stall: at nats-py's cap of PubAcks in flight, wait at most as long as for one
                acks.append(await js.publish_async(subject, data, headers=headers, wait_stall=self._ack_timeout_s))
        except Exception as exc:  # noqa: BLE001 - any failure to put a message on the wire fails the parcel
            self._stop(exc)
            self._report(parcel, messages, exc, at=len(acks))
            return
        self._keep(self._acknowledged(parcel, messages, acks))

    def _keep(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _acknowledged(self, parcel: Parcel, messages: list[Message], acks: list[asyncio.Future[Any]]) -> None:
        """Report `parcel` once every PubAck is in, or at the first failure (the timeout, the
        connection closing)."""
        waiting: asyncio.Future[Any] = asyncio.ensure_future(asyncio.wait(acks, timeout=self._ack_timeout_s))
        either: list[asyncio.Future[Any]] = [waiting, self._closed]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        for i, ack in enumerate(acks):
            if not ack.done():
                error: BaseException = (
                    TimeoutError(f"no acknowledgement from JetStream within {self._ack_timeout_s:g} s")
                    if not self._closed.done()
                    else (self._stopped or ConnectionError("the connection to NATS closed"))
                )
            elif ack.exception() is not None:
                error = ack.exception()  # type: ignore[assignment]
            else:
                continue
            waiting.cancel()
            self._stop(error)
            self._report(parcel, messages, error, at=i)
            return
        self._reports.put((parcel, len(messages), None))

    def _report(self, parcel: Parcel, messages: list[Message], error: BaseException, at: int = 0) -> None:
        self._reports.put((parcel, len(messages), (messages[at][1] if messages else b"", error)))

    def _stop(self, error: BaseException) -> None:
        """The first failure: nothing more goes on the wire; the connection closes."""
        if self._stopped is not None:
            return
        self._stopped = error
        if not self._closed.done():
            self._closed.set_result(None)
        if self._connection is not None and not self._connection.is_closed:
            self._keep(self._connection.close())

    async def close(self) -> None:
        self._stop(Unsent("the publisher was closed"))
        if self._task is not None:
            self._task.cancel()
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()


class JetStreamPublisher(HandOverPublisher[Message]):
    """The loop's side of one session's publishing (relay.core.boundaries.Publisher, through
    relay.core.handover). Every method runs on the loop's thread."""

    def __init__(
        self,
        thread: EventLoopThread,
        sender: Sender,
        reports: queue.SimpleQueue[Report],
        max_payload: int,
        stream_of: Callable[[str], str | None],
    ) -> None:
        super().__init__(reports, lambda parcel, messages, by: thread.call(sender.hand, parcel, messages, by))
        self._thread = thread
        self._sender = sender
        self._max_payload = max_payload
        self._stream_of = stream_of  # the stream storing a subject (None: none), asked after "no responders"

    def converter(self) -> Callable[[OutgoingMessage], Message]:
        return lambda m: to_nats(m, self._max_payload)

    def broker_failure(self, parcel: Parcel, event_id: str, error: BaseException) -> Exception:
        """The relay's error for a failure JetStream's client reported."""
        refusal = refusal_of(error)
        if refusal is not None:
            return PoisonEventError(event_id, f"JetStream refused it: {refusal}")
        subject = next((m.topic for m in parcel.messages if m.event_id == event_id), "?")
        if isinstance(error, NoStreamResponseError):
            return self._no_stream(event_id, subject)
        if isinstance(error, APIError) and error.code != UNAVAILABLE:
            return ServerRefusedError(f"JetStream refused event {event_id} on subject {subject}: {describe(error)}")
        return DeliveryError(event_id, f"JetStream: {describe(error)}")

    def _no_stream(self, event_id: str, subject: str) -> Exception:
        """No stream answered for `subject`: a poison event when the stream is up and does not store
        that subject (a document's topic field sent it elsewhere), else a failure to try again."""
        try:
            stored_by = self._stream_of(subject)
        except Exception as exc:  # noqa: BLE001 - JetStream not answering now: try again later
            return DeliveryError(event_id, f"no stream answered for subject {subject} ({describe(exc)})")
        if stored_by is None:
            return PoisonEventError(event_id, f"no JetStream stream stores its subject {subject}")
        return DeliveryError(event_id, f"stream {stored_by} did not answer for subject {subject}")

    def close(self) -> None:
        """Stop the sender and close the connection: what is in flight is dropped (nothing of it
        was stored as a checkpoint)."""
        with contextlib.suppress(Exception):
            self._thread.run(self._sender.close(), _CLOSE_TIMEOUT_S)

"""The loop's side of a publisher whose messages go on the wire on another thread (relay.nats and
relay.rabbitmq: an asyncio client on relay.loop_thread's event loop): each parcel's messages
turned into the broker's form and handed over whole, the reports taken back from one queue.

| state | owned by | what it holds |
| --- | --- | --- |
| `HandOverPublisher` | the loop's thread | messages handed over and not yet reported (`queued`), the first failure it took (`_broken`) |
| `reports` (a `queue.SimpleQueue`) | both: the sender puts `(parcel, count, failure)`, the publisher takes | |

Rules, each enforced here:
- A parcel is reported whole: one report per parcel (its message count, and the first failure's
  value and error, if any), so `Parcel.reported` settles it at once.
- A message the broker cannot carry as it is (`Refused`, raised by the broker's converter) fails
  the parcel there as poison, naming its event; the messages before it are handed over.
- After the first failed report, nothing more is handed over: later parcels fail unsent (the loop
  publishes again from its stored checkpoint on a fresh session).
Pure: no client, no I/O but the queue.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from relay.core.errors import DeliveryError, LeaseUnrenewedError, PoisonEventError
from relay.core.message import OutgoingMessage
from relay.core.window import Parcel

M = TypeVar("M")
Failure = tuple[bytes, BaseException]
Report = tuple[Parcel, int, Failure | None]
Handover = Callable[[Parcel, list[M], float | None], None]


class Refused(Exception):
    """Raised when a message cannot go to the broker as it is; the text says why (the event is poison)."""


class Unsent(Exception):
    """Raised (as a parcel's failure) for a message the publisher did not put on the wire: refused
    as it is (`event_id`, the reason), or left unsent after an earlier failure."""

    def __init__(self, reason: str, event_id: str | None = None) -> None:
        super().__init__(reason)
        self.event_id = event_id


class LeaseNotHeld(Exception):
    """A parcel's `publish_by` passed before it went on the wire."""


class HandOverPublisher(Generic[M]):
    """relay.core.boundaries.Publisher on the loop's thread: `hand(parcel, messages, publish_by)`
    passes a parcel's messages (each `convert`ed) to the sender's thread, which puts one report per
    parcel in `reports`. A broker's publisher adds `failure` for its own errors (`broker_failure`)."""

    def __init__(self, reports: queue.SimpleQueue[Report], hand: Handover[M]) -> None:
        self._reports = reports
        self._hand = hand
        self._queued = 0
        self._broken: BaseException | None = None

    def converter(self) -> Callable[[OutgoingMessage], M]:
        """How this parcel's messages become the broker's (raises Refused)."""
        raise NotImplementedError

    def send(self, parcel: Parcel, while_waiting: Callable[[], None]) -> None:
        """Hand the parcel's messages to the sender (never blocks). A message the broker cannot
        carry fails the parcel there, naming its event; the messages before it are sent."""
        if self._broken is not None:
            parcel.refuse(len(parcel.messages), (b"", Unsent(f"not sent after an earlier failure: {self._broken}")))
            return
        messages: list[M] = []
        refused: Failure | None = None
        convert = self.converter()
        for m in parcel.messages:
            try:
                messages.append(convert(m))
            except Refused as exc:
                refused = (m.value, Unsent(str(exc), m.event_id))
                break
        if messages:
            self._queued += len(messages)
            self._hand(parcel, messages, parcel.publish_by)
        if refused is not None:
            parcel.refuse(len(parcel.messages) - len(messages), refused)

    def poll(self, timeout: float) -> None:
        """Take the reports that came in, waiting up to `timeout` for the first."""
        try:
            report = self._reports.get(timeout=timeout) if timeout > 0 else self._reports.get_nowait()
        except queue.Empty:
            return
        while True:
            self._take(report)
            try:
                report = self._reports.get_nowait()
            except queue.Empty:
                return

    def drain(self, timeout: float) -> None:
        """Wait up to `timeout` for every report (nothing is held back to fill a batch)."""
        deadline = time.monotonic() + timeout
        while self._queued and self._broken is None and (left := deadline - time.monotonic()) > 0:
            self.poll(left)

    def due_in(self) -> float | None:
        """Nothing is held open: the loop decides when to wait."""
        return None

    def _take(self, report: Report) -> None:
        parcel, count, failure = report
        parcel.reported(count, failure)
        self._queued -= count
        if failure is not None and self._broken is None:
            self._broken = failure[1]

    def failure(self, parcel: Parcel) -> Exception:
        """The relay's error for the parcel's first failure: the hand-over's own (poison, unsent,
        the lease's validity passed), else the broker's (`broker_failure`)."""
        assert parcel.failure is not None, "no failed report"
        error = parcel.failure[1]
        event_id = parcel.failed_event_id()
        if isinstance(error, Unsent):
            if error.event_id is not None:
                return PoisonEventError(error.event_id, str(error))
            return DeliveryError(event_id, str(error))
        if isinstance(error, LeaseNotHeld):
            return LeaseUnrenewedError(
                f"event {event_id} not published: {error}; restarting from the stored checkpoint"
            )
        return self.broker_failure(parcel, event_id, error)

    def broker_failure(self, parcel: Parcel, event_id: str, error: BaseException) -> Exception:
        """The relay's error for a failure the broker's client reported for event `event_id`."""
        raise NotImplementedError

    @property
    def queued(self) -> int:
        """Messages handed over and not yet reported."""
        return self._queued

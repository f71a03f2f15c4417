"""The relay loop: the only place that knows the order of steps (docs/architecture.md tells it
as a story). `Relay.turn()` is one pass: a standby tries to take the lease; a new leader opens the
stream where relay.core.resume decides; a leader takes one `_step` (read, encode, hand to the
producer, store what Kafka acknowledged) or hands the lease over. An error that ends a pass goes
through the outcome table, by the action its kind carries (relay.core.errors.classify):

| action  | what the loop does |
| ------- | ------------------ |
| RESTART | drop the stream and the producer; reopen from the checkpoint after the restart policy's wait (relay.core.restarts) |
| REOPEN  | the same, unless the same code repeats without progress: then stop (RepeatedStreamError) |
| POISON  | the poison policy decides (relay.core.poison): STOP at the event (what precedes it is already stored), DEAD_LETTER it on the replay, or ISOLATE the refused batch (one message per request); both replays start at once |
| FENCED  | drop the stream and the producer (never release a lease that is not ours), poll as a standby; with RELAY_ON_LEASE_LOST=exit, stop |
| STOP    | raise: `run()` writes the stop line and shuts down |

Shutdown order, on `stop()`: finish the parcels in flight and store their checkpoint at once
(with whatever the session still holds: relay.core.coalescer); close the change stream; drop the producer (it holds nothing undelivered); release the lease so a standby
takes over at once. The process (relay.group.runner) closes the shared clients after every loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from relay.core.boundaries import (
    ALWAYS,
    Assignment,
    ChangeSource,
    Clock,
    DeliveryMode,
    Encoder,
    LeaseStore,
    LoopObserver,
    Publisher,
    SystemClock,
)
from relay.core.change import Batch
from relay.core.checkpoints import CheckpointWriter
from relay.core.coalescer import Coalescer
from relay.core.config import WAIT_SLICE_S, LoopConfig
from relay.core.errors import (
    Action,
    BatchRefusedError,
    ForeignClassifier,
    HistoryLostError,
    PoisonEventError,
    RelayError,
    ReopenableStreamError,
    TransientError,
    classify,
)
from relay.core.poison import Decision, PoisonPolicy, encode
from relay.core.positions import Grant, short_token
from relay.core.restarts import RestartPolicy
from relay.core.resume import IfLost, Resume, Rules, Store, resume
from relay.core.window import Parcel, Window, split

log = logging.getLogger("relay")


@dataclass
class Session:
    """What a leader holds while it leads: the lease grant, the stream, the producer, the window."""

    grant: Grant
    source: ChangeSource
    publisher: Publisher
    window: Window


ObserverT = TypeVar("ObserverT", bound=LoopObserver)


class Relay(Generic[ObserverT]):
    """Publishes one outbox collection (or one partition of it) to Kafka while it holds the lease.

    Its boundaries are given (relay.core.boundaries; `relay.wiring.build` passes the real ones):
    `source` makes a fresh change source for every leading session and `mode` its producer, the
    offsets record and its tombstone; `lease` is the lease document; `encoder` builds messages;
    `fingerprint` identifies the source's pipeline (stored beside every token); `assignment` says
    when to try the lease and when to hand it over (alone on its outbox: always try, never hand
    over); `foreign_errors` classifies the drivers' exceptions (relay.core.errors.classify);
    `coalescer` is the process's, where every loop's checkpoints are written together
    (relay.core.coalescer; without it, each is written at once to `lease`).
    """

    def __init__(
        self,
        config: LoopConfig,
        *,
        source: Callable[[], ChangeSource],
        mode: DeliveryMode,
        lease: LeaseStore,
        encoder: Encoder,
        observer: ObserverT,
        fingerprint: str,
        clock: Clock | None = None,
        assignment: Assignment = ALWAYS,
        foreign_errors: ForeignClassifier | None = None,
        coalescer: Coalescer | None = None,
    ) -> None:
        self.config = config
        self.observer: ObserverT = observer
        self._sources = source
        self._mode = mode
        self._lease = lease
        self._encoder = encoder
        self._fingerprint = fingerprint
        self._clock: Clock = clock or SystemClock()
        self._assignment = assignment
        self._foreign_errors = foreign_errors
        self._stopping = threading.Event()
        self._poison = PoisonPolicy(config.on_poison)
        self._session: Session | None = None
        self._role = "starting"
        self._checkpoints = CheckpointWriter(
            lease, fingerprint, self._clock, config.timing, observer.checkpoint_stored, coalescer, self._transient
        )
        self._restarts = RestartPolicy(
            config.restart_backoff_max_s, lambda s: self._clock.wait(s, self._stopping), observer.restart
        )

    # ---- public -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the parcels in flight and shut down (thread- and signal-safe)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        """Run until `stop()`. Raises the error that made the relay stop, after writing it as the
        stop's one ERROR line (see errors.classify for which errors stop it)."""
        try:
            log.info("relay watching %s", self._lease.lease_id)
            while not self.stopping:
                self.turn()
            self._finish()
        except Exception as exc:
            self.observer.stopped(exc)
            if isinstance(exc, RelayError):
                exc.logged = True
            raise
        finally:
            self._release()

    def turn(self) -> None:
        """One pass of the loop: as a standby try to take the lease, as a leader take one step;
        an error goes through the outcome table. Raises only the errors that stop the relay."""
        try:
            if self._session is None:
                self._lead_if_free()
            elif self._assignment.hand_over():
                self._hand_over()
            else:
                self._step(self._session)
        except Exception as exc:  # noqa: BLE001 - every error goes through classify()
            self._outcome(exc)

    # ---- taking the lease and opening the stream --------------------------------------------------

    def _lead_if_free(self) -> None:
        if not self._assignment.may_lead():
            self._wait_as_standby("the lease is above this replica's share")
            return
        asked_at = self._clock.monotonic()
        grant = self._lease.try_acquire()
        self._assignment.led(grant is not None)
        if grant is None:
            self._wait_as_standby(f"another replica holds the lease on {self._lease.lease_id}")
            return
        self._checkpoints.begin(grant, asked_at)  # acquiring renewed the lease
        self.observer.role("leader", grant.fencing_token)
        if self._role != "leader":
            log.info("holding the lease, fencing token %d", grant.fencing_token)
        self._role = "leader"
        source = self._sources()
        publisher = self._mode.start(grant, self._heartbeat)
        self._session = session = Session(grant, source, publisher, self._window())
        self.observer.watch_publisher(publisher)
        self._open(session)

    def _window(self) -> Window:
        """At-least-once: up to RELAY_PIPELINE_DEPTH reads in flight. Exactly-once: the reads of the
        open Kafka transaction, whose parcels are acknowledged only once it commits, so no
        token is stored before its commit (window.Window.transaction)."""
        c = self.config
        if c.transaction_max_events is None:
            return Window(c.max_in_flight_events, c.pipeline_depth)
        return Window.transaction(c.transaction_max_events, c.max_in_flight_events)

    def _wait_as_standby(self, why: str) -> None:
        if self._role != "standby":
            log.info("standby: %s", why)
            self._role = "standby"
            self.observer.role("standby", None)
        self.observer.tick()
        self._clock.wait(self.config.timing.standby_poll_s, self._stopping)

    def _open(self, session: Session) -> None:
        """Open the stream where the resume decision says (relay.core.resume.resume, its table):
        first forget a stale offsets record if it says so, then open, then store what it says to
        store at once (the opening token when there is no checkpoint, unless the stream was
        rescanned; the offsets record's token when that was newer than the checkpoint, so `status`
        shows it)."""
        rules = self._resume_rules()
        plan = resume(session.grant.checkpoint, lambda: self._mode.committed_record(self._heartbeat), rules)
        if plan.forget is not None:
            log.warning(
                "no MongoDB checkpoint for %s, but %s holds token %s: forgetting it (starting at RELAY_START_AT=%s)",
                plan.forget.lease_id,
                rules.offsets_topic,
                short_token(plan.forget.token),
                rules.start_at,
            )
            self._mode.forget(session.publisher, self._heartbeat)
        if plan.rescan:
            session.source.rescan()
            opened = False
        else:
            opened = self._open_at(session.source, plan)
        log.info("change stream opened %s", plan.description)
        # At once, not at the next interval: a crash must not let a later "now" become the start.
        if plan.store is Store.OPENING and opened and session.source.token is not None:
            self._checkpoints.store(session.source.token, now=True)
        elif plan.store is Store.RESUMED and plan.start.resume_after is not None:
            self._checkpoints.store(plan.start.resume_after, now=True)

    def _resume_rules(self) -> Rules:
        """What the resume decision reads from the settings and the delivery mode."""
        c, m = self.config, self._mode
        return Rules(self._fingerprint, m.name, c.start_at, c.on_history_lost, m.offsets_topic)

    def _open_at(self, source: ChangeSource, plan: Resume) -> bool:
        """Open `source` at the plan's start; if that point left the oplog, do what the plan says
        (stop, rescan, or retry: a restart opens again). False when it rescans: the scanned
        documents have no position, so nothing may be stored until the scan's end is (`_idle`)."""
        try:
            source.open(plan.start)
            return True
        except HistoryLostError as exc:
            if plan.if_lost is IfLost.RETRY:
                raise TransientError("the oplog rolled over while opening at its start") from exc
            if plan.if_lost is IfLost.STOP:
                raise
            log.error(
                "the checkpoint fell off the oplog; RELAY_ON_HISTORY_LOST=rescan: re-publishing "
                "every document in %s (expect duplicates)",
                self._lease.lease_id,
            )
            source.rescan()
            return False

    # ---- one step -----------------------------------------------------------------------------

    def _step(self, s: Session) -> None:
        """Read one batch and hand it to the producer, then store what is acknowledged."""
        self.observer.tick()
        window = s.window
        if window.full:
            self._settle(s, keep=0 if window.fills else len(window) - 1)
        due = s.publisher.due_in()
        if due is not None and not s.source.ready(due):
            self._settle(s, keep=0)  # the read would hold the open transaction past its time bound
        batch = s.source.next_batch(min(window.room, window.slice))
        read_at = self._clock.monotonic()
        if batch.resumed:
            self.observer.resumed()
        if not batch.changes:
            self._settle(s, keep=0)
            self._checkpoints.idle(batch.token)
            return
        self._checkpoints.read()
        self._checkpoints.beat()  # a replica that was paused learns here that it lost the lease
        self._publish(s, batch, read_at)
        self._settle(s, keep=window.keep)

    def _publish(self, s: Session, batch: Batch, read_at: float) -> None:
        """Hand the batch's messages to the producer, each parcel with the token covering it.

        Under the stop policy a poison event ends the batch: the events before it are published
        and stored, then its error is raised (a restart stops at the same event again).
        """
        messages, poison = encode(
            batch.changes, s.grant.fencing_token, self._encoder, self._poison, self.observer.dead_lettered
        )
        start, sizes = 0, [len(m.value) for m in messages]
        for end, alone in split(sizes, self.config.batch_max_bytes, self._poison.one_by_one):
            parcel = Parcel(
                batch.wall_ms(start, end),
                messages[start:end],
                batch.token_after(end),
                self._clock.monotonic(),
                alone,
                read_at,
                sum(sizes[start:end]),
                self._checkpoints.valid_until,
            )
            s.publisher.send(parcel, self._heartbeat)
            s.window.add(parcel)
            start = end
            if alone:
                self._settle(s, keep=0)  # its own request: the broker's answer names it
            elif end < len(messages):
                self._settle(s, keep=s.window.keep)  # bytes in flight stay bounded
        if poison is not None:
            self._settle(s, keep=0)
            raise poison

    def _settle(self, s: Session, keep: int) -> None:
        """Store the token of the newest parcel that Kafka acknowledged along with every one
        before it, after waiting until at most `keep` parcels remain in flight.

        This is where guarantee 1 holds: a token is stored only once every delivery report up
        to it succeeded. A failed report raises its error, after storing what was acknowledged
        before it (the caller replays from there).

        Guarantee 7 holds here too: every settle that saw a parcel acknowledged writes the lease,
        fenced. Rescanned documents have no position, so a rescan's parcels store nothing; the
        lease is renewed instead, so a replica that lost it stops after one batch in a rescan too.
        """
        s.publisher.poll(0)
        window, newest, acknowledged, events = s.window, None, False, 0
        try:
            while (parcel := window.oldest) is not None:
                if not parcel.done:
                    if len(window) <= keep:
                        break
                    self._await(s, parcel, everything=keep == 0)
                if parcel.failure is not None:
                    raise s.publisher.failure(parcel)
                window.pop_acknowledged()
                if parcel.one_by_one:
                    self._poison.sent_alone()
                now = self._clock.monotonic()
                self.observer.published(
                    parcel.wall_ms, parcel.messages, now - parcel.sent_at, parcel.token, now - parcel.read_at
                )
                newest = parcel.token or newest
                acknowledged = True
                events += len(parcel.messages)
        finally:
            if newest is not None:
                self._checkpoints.store(newest, events=events)
                self._restarts.progressed()
            elif acknowledged:
                self._checkpoints.renew()  # rescanned documents: nothing to store, the lease still fenced

    def _await(self, s: Session, parcel: Parcel, everything: bool) -> None:
        """Serve reports until `parcel`'s are in (`everything`: the loop waits for every
        parcel in flight, so the producer need not hold anything back: Publisher.drain)."""
        wait = s.publisher.drain if everything else s.publisher.poll
        while not parcel.done:
            wait(WAIT_SLICE_S)
            self._heartbeat()

    def _heartbeat(self) -> None:
        """Runs while waiting on Kafka: keep the lease alive so a slow broker is not a takeover."""
        self.observer.tick()
        self._checkpoints.beat()

    # ---- outcomes -------------------------------------------------------------------------------

    def _transient(self, exc: BaseException) -> bool:
        """Whether `exc` is an error a restart would cure (a lease write may survive it)."""
        return classify(exc, self._foreign_errors) is Action.RESTART

    def _outcome(self, exc: Exception) -> None:
        """What an error that ended a pass leads to (the table in the module docstring)."""
        handlers: dict[Action, Callable[[Any], None]] = {
            Action.RESTART: self._restart,
            Action.REOPEN: self._reopen,
            Action.POISON: self._on_poison,
            Action.FENCED: self._standby,
            Action.STOP: self._stop,
        }
        handlers[classify(exc, self._foreign_errors)](exc)

    def _restart(self, exc: Exception) -> None:
        self._close_session(store=True)
        self._restarts.restart(exc)

    def _reopen(self, exc: ReopenableStreamError) -> None:
        self._restarts.check_reopen(exc)  # raises when it repeated: the stop releases the lease
        self._restart(exc)

    def _on_poison(self, exc: PoisonEventError | BatchRefusedError) -> None:
        decision = self._poison.decide(exc)
        if decision is Decision.STOP:
            raise exc  # what precedes the event is stored (_publish, _settle)
        if decision is Decision.DEAD_LETTER and isinstance(exc, PoisonEventError):
            log.error(
                "event %s refused by the broker (%s): dead-lettering it on the replay",
                exc.event_id,
                exc.reason,
                extra={"event_id": exc.event_id},
            )
        self._close_session(store=True)
        self._restarts.restart(exc, at_once=True)

    def _standby(self, exc: Exception) -> None:
        self._close_session(store=False)
        self._assignment.led(False)
        self.observer.lease_lost(exc)
        if self.config.on_lease_lost == "exit":
            raise exc
        self._role = "standby"
        self.observer.role("standby", None)

    def _stop(self, exc: Exception) -> None:
        raise exc

    # ---- shutdown -----------------------------------------------------------------------------

    def _close_session(self, *, store: bool) -> None:
        """End the session: write the checkpoints it holds (`store`: what Kafka acknowledged stays
        acknowledged; a failure leaves it to the next session, which replays from the stored
        checkpoint) or drop them (its lease is lost), then close the stream and the producer."""
        session, self._session = self._session, None
        if session is not None:
            try:
                self._checkpoints.end(store=store)
            except Exception as exc:  # noqa: BLE001 - the next session replays from the stored checkpoint
                log.warning(
                    "could not store the session's last checkpoint (%s); the next leader replays from the stored one",
                    exc,
                )
            session.source.close()
            session.publisher.close()
            session.window.clear()

    def _finish(self) -> None:
        """Stopping: deliver and store what is in flight (a failure leaves it to the next leader)."""
        if self._session is None:
            return
        try:
            self._settle(self._session, keep=0)
            self._checkpoints.flush()
        except Exception as exc:  # noqa: BLE001 - the next leader replays from the last checkpoint
            log.warning(
                "stopping without storing the last parcels (%s); the next leader replays them from the checkpoint",
                exc,
            )

    def _release(self) -> None:
        """Close the session and release its lease (a failure leaves it to expire)."""
        session = self._session
        self._close_session(store=True)  # the final checkpoints, before the lease is released
        if session is not None:
            try:
                self._lease.release(session.grant)
                log.info("lease released (fencing token %d)", session.grant.fencing_token)
            except Exception as exc:  # noqa: BLE001 - it expires on its own
                log.warning("could not release the lease (it will expire): %s", exc)
            self._assignment.led(False)

    def _hand_over(self) -> None:
        """Give the lease to another replica at a batch boundary, as a stop would: deliver and store
        what is in flight, release the lease; then wait as a standby (the clients stay open)."""
        self._finish()
        self._release()
        log.info("handed the lease over")
        self._role = "standby"
        self.observer.role("standby", None)

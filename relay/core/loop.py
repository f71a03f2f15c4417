"""The relay loop: the only place that knows the order of steps.

One step (`_step`), while holding the lease:
  1. read a batch of changes and the token that covers exactly them (boundaries.ChangeSource);
  2. build each Kafka message (boundaries.Encoder); a poison event is dead-lettered in place, or
     (stop policy) ends the batch before it (poison.encode);
  3. hand them to the producer (boundaries.Publisher) in deliveries that close once they reach
     RELAY_BATCH_MAX_BYTES (window.split); up to RELAY_PIPELINE_DEPTH deliveries are in flight, holding
     together at most RELAY_BATCH_MAX_EVENTS events (window.Window); in exactly-once mode the
     reads of the open Kafka transaction, at most RELAY_TRANSACTION_MAX_EVENTS events, none of
     them acknowledged before the commit (window.Window.transaction); a read that would keep
     that transaction open past its time bound is preceded by its commit;
  4. `_settle`: store, with a fenced majority write (boundaries.LeaseStore.commit), the token of
     the newest delivery that Kafka acknowledged along with every delivery before it.
An idle step first settles everything in flight, then stores the post-batch token at most every
heartbeat interval (guarantee 7).

`turn()` is one pass of the loop: a standby tries to take the lease (when its assignment says
so: boundaries.Assignment, the share of a group of replicas over the partitions of an outbox); a
new leader gets its producer (boundaries.DeliveryMode; exactly-once mode fences the lease's earlier
producers), decides where to resume (resume.resume, from the lease's checkpoint, the offsets
topic's record where its table needs it, and RELAY_START_AT), forgets a stale offsets record when
that says so, opens the stream there (applying RELAY_ON_HISTORY_LOST if the point left the oplog)
and stores what it says to store at once; a leader takes one step, or, between steps, hands
the lease over when its assignment asks (`_hand_over`: the shutdown below without closing the
clients, then standby). An exception ends the pass and goes through the outcome table
(`_outcome`), keyed by the action each error kind carries (`errors.classify`; the drivers'
exceptions are classified by the classifier the wiring passes):

| action  | what the loop does |
| ------- | ------------------ |
| RESTART | drop the stream and the producer, wait (exponential backoff while no progress is made), reopen from the checkpoint |
| REOPEN  | the same, unless the same code repeats without progress: then stop (RepeatedStreamError) |
| POISON  | the poison policy decides: STOP at the event (what precedes it is already stored), DEAD_LETTER it on the replay, or ISOLATE the refused batch (replay it one message per request); both replays start at once |
| FENCED  | drop the stream and the producer (never release a lease that is not ours), poll as a standby; with RELAY_ON_LEASE_LOST=exit, stop |
| STOP    | raise: `run()` writes the stop line and shuts down |

Shutdown order, on `stop()`: finish the deliveries in flight and store their checkpoint; close
the change stream; drop the producer (it holds nothing undelivered); release the lease so a
standby takes over at once; run `close` (in the relay process, relay.group.runner closes the
shared client once every loop stopped).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tenacity import RetryCallState, wait_exponential_jitter

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
from relay.core.config import WAIT_SLICE_S, LoopConfig
from relay.core.errors import (
    Action,
    BatchRefusedError,
    ForeignClassifier,
    HistoryLostError,
    PoisonEventError,
    RelayError,
    ReopenableStreamError,
    RepeatedStreamError,
    TransientError,
    classify,
)
from relay.core.poison import Decision, PoisonPolicy, encode
from relay.core.positions import Grant, Token, short_token
from relay.core.resume import IfLost, Resume, Rules, Store, resume
from relay.core.window import Delivery, Window, split

log = logging.getLogger("relay")


@dataclass
class Session:
    """What a leader holds while it leads: the lease grant, the stream, the producer, the window."""

    grant: Grant
    source: ChangeSource
    publisher: Publisher
    window: Window


def _nothing() -> None:
    pass


ObserverT = TypeVar("ObserverT", bound=LoopObserver)


class Relay(Generic[ObserverT]):
    """Publishes one outbox collection (or one partition of it) to Kafka while it holds the lease.

    Its boundaries are given: `source` makes a fresh change source for every leading session and
    `delivery` its producer, the offsets record and its tombstone (the delivery mode,
    relay.kafka.modes); `lease` is the lease document; `encoder` builds messages; `fingerprint`
    identifies the source's pipeline (stored beside every token); `preflight` runs once at the
    start of `run()` (configuration and reachability checks); `close` releases the clients after
    the lease; `assignment` says when to try the lease and when to hand it over (a relay alone on
    its outbox: always try, never hand over); `foreign_errors` classifies the drivers' exceptions
    (relay.core.errors.classify). `relay.wiring.build` passes the real ones (neither `preflight`
    nor `close`: the process's group runs the start-up checks and closes the client).
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
        preflight: Callable[[], None] = _nothing,
        close: Callable[[], None] = _nothing,
        assignment: Assignment = ALWAYS,
        foreign_errors: ForeignClassifier | None = None,
    ) -> None:
        self.config = config
        self.observer: ObserverT = observer
        self._sources = source
        self._mode = mode
        self._lease = lease
        self._encoder = encoder
        self._fingerprint = fingerprint
        self._clock: Clock = clock or SystemClock()
        self._preflight = preflight
        self._close = close
        self._assignment = assignment
        self._foreign_errors = foreign_errors
        self._stopping = threading.Event()
        self._poison = PoisonPolicy(config.on_poison)
        self._session: Session | None = None
        self._role = "starting"
        self._last_write = 0.0  # monotonic time of the last write to the lease document
        self._last_token: Token | None = None  # the last token this relay stored
        # An idle read's newer token not stored yet (stored within a heartbeat interval, or when
        # the session ends): it covers only acknowledged events, as `_idle` settles first.
        self._unstored: Token | None = None
        self._failures = 0  # restarts since the last progress (a stored checkpoint covering new events)
        self._repeat_code: int | None = None  # the reopenable stream error met since the last progress
        self._backoff = wait_exponential_jitter(multiplier=0.2, max=config.restart_backoff_max_s, jitter=0.2)

    # ---- public -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the deliveries in flight and shut down (thread- and signal-safe)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        """Run until `stop()`. Raises the error that made the relay stop, after writing it as the
        stop's one ERROR line (see errors.classify for which errors stop it)."""
        try:
            self._preflight()
            log.info("relay watching %s", self.config.namespace)
            while not self.stopping:
                self.turn()
            self._finish()
        except Exception as exc:
            self.observer.stopped(exc)
            if isinstance(exc, RelayError):
                exc.logged = True
            raise
        finally:
            self._shutdown()

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
        grant = self._lease.try_acquire()
        self._assignment.led(grant is not None)
        if grant is None:
            self._wait_as_standby(f"another replica holds the lease on {self.config.namespace}")
            return
        self._last_write = self._clock.monotonic()  # acquiring renewed the lease
        self.observer.role("leader", grant.fencing_token)
        if self._role != "leader":
            log.info("holding the lease, fencing token %d", grant.fencing_token)
        self._role = "leader"
        source = self._sources()
        publisher = self._mode.start(grant, lambda: self._heartbeat(grant))
        self._session = session = Session(grant, source, publisher, self._window())
        self._unstored = None
        self.observer.watch_publisher(publisher)
        self._open(session)

    def _window(self) -> Window:
        """At-least-once: up to RELAY_PIPELINE_DEPTH reads in flight. Exactly-once: the reads of the
        open Kafka transaction, whose deliveries are acknowledged only once it commits, so no
        token is stored before its commit (window.Window.transaction)."""
        c = self.config
        if c.transaction_max_events is None:
            return Window(c.batch_max_events, c.pipeline_depth)
        return Window.transaction(c.transaction_max_events, c.batch_max_events)

    def _wait_as_standby(self, why: str) -> None:
        if self._role != "standby":
            log.info("standby: %s", why)
            self._role = "standby"
            self.observer.role("standby", None)
        self.observer.tick()
        self._clock.wait(self.config.standby_poll_s, self._stopping)

    def _open(self, session: Session) -> None:
        """Open the stream where the resume decision says (relay.core.resume.resume, its table):
        first forget a stale offsets record if it says so, then open, then store what it says to
        store at once (the opening token when there is no checkpoint, unless the stream was
        rescanned; the offsets record's token when that was newer than the checkpoint, so `status`
        shows it)."""
        grant = session.grant

        def heartbeat() -> None:
            self._heartbeat(grant)

        rules = self._resume_rules()
        plan = resume(grant.checkpoint, lambda: self._mode.committed_record(heartbeat), rules)
        if plan.forget is not None:
            log.warning(
                "no MongoDB checkpoint for %s, but %s holds token %s: forgetting it (starting at RELAY_START_AT=%s)",
                plan.forget.lease_id,
                rules.offsets_topic,
                short_token(plan.forget.token),
                rules.start_at,
            )
            self._mode.forget(session.publisher, heartbeat)
        opened = self._open_at(session.source, plan)
        log.info("change stream opened %s", plan.description)
        if plan.store is Store.OPENING and opened and session.source.token is not None:
            self._store(session, session.source.token)
        elif plan.store is Store.RESUMED and plan.start.resume_after is not None:
            self._store(session, plan.start.resume_after)

    def _resume_rules(self) -> Rules:
        """What the resume decision reads from the settings and the delivery mode."""
        c, p = self.config, self._mode
        return Rules(self._fingerprint, p.name, c.start_at, c.on_history_lost, p.offsets_topic)

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
                self.config.namespace,
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
            self._idle(s, batch)
            return
        self._unstored = None  # the batch's own token will cover more
        self._heartbeat(s.grant)  # a replica that was paused learns here that it lost the lease
        self._publish(s, batch, read_at)
        self._settle(s, keep=window.keep)

    def _publish(self, s: Session, batch: Batch, read_at: float) -> None:
        """Hand the batch's messages to the producer, each delivery with the token covering it.

        Under the stop policy a poison event ends the batch: the events before it are published
        and stored, then its error is raised (a restart stops at the same event again).
        """
        messages, poison = encode(
            batch.changes, s.grant.fencing_token, self._encoder, self._poison, self.observer.dead_lettered
        )
        start = 0
        for end, alone in split([len(m.value) for m in messages], self.config.batch_max_bytes, self._poison.one_by_one):
            delivery = Delivery(
                batch.wall_ms(start, end),
                messages[start:end],
                batch.token_after(end),
                self._clock.monotonic(),
                alone,
                read_at,
            )
            s.publisher.send(delivery, lambda: self._heartbeat(s.grant))
            s.window.add(delivery)
            start = end
            if alone:
                self._settle(s, keep=0)  # its own request: the broker's answer names it
            elif end < len(messages):
                self._settle(s, keep=s.window.keep)  # bytes in flight stay bounded
        if poison is not None:
            self._settle(s, keep=0)
            raise poison

    def _settle(self, s: Session, keep: int) -> None:
        """Store the token of the newest delivery that Kafka acknowledged along with every one
        before it, after waiting until at most `keep` deliveries remain in flight.

        This is where guarantee 1 holds: a token is stored only once every delivery report up
        to it succeeded. A failed report raises its error, after storing what was acknowledged
        before it (the caller replays from there).

        Guarantee 7 holds here too: every settle that saw a delivery acknowledged writes the lease,
        fenced. Rescanned documents have no position, so a rescan's deliveries store nothing; the
        lease is renewed instead, so a replica that lost it stops after one batch in a rescan too.
        """
        s.publisher.poll(0)
        window, newest, acknowledged = s.window, None, False
        try:
            while (delivery := window.oldest) is not None:
                if not delivery.done:
                    if len(window) <= keep:
                        break
                    self._await(s, delivery, everything=keep == 0)
                if delivery.failure is not None:
                    raise s.publisher.failure(delivery)
                window.pop_acknowledged()
                if delivery.one_by_one:
                    self._poison.sent_alone()
                now = self._clock.monotonic()
                self.observer.published(
                    delivery.wall_ms, delivery.messages, now - delivery.sent_at, delivery.token, now - delivery.read_at
                )
                newest = delivery.token or newest
                acknowledged = True
        finally:
            if newest is not None:
                self._store(s, newest)
                self._failures, self._repeat_code = 0, None  # progress
            elif acknowledged:
                self._renew(s.grant)  # rescanned documents: nothing to store, the lease still fenced

    def _await(self, s: Session, delivery: Delivery, everything: bool) -> None:
        """Serve reports until `delivery`'s are in (`everything`: the loop waits for every
        delivery in flight, so the producer need not hold anything back: Publisher.drain)."""
        wait = s.publisher.drain if everything else s.publisher.poll
        while not delivery.done:
            wait(WAIT_SLICE_S)
            self._heartbeat(s.grant)

    def _idle(self, s: Session, batch: Batch) -> None:
        """Nothing new: settle everything in flight, then store the post-batch token (or renew)
        once a heartbeat interval has passed since the last write."""
        self._settle(s, keep=0)
        fresh = batch.token if batch.token is not None and batch.token != self._last_token else None
        if self._clock.monotonic() - self._last_write >= self.config.heartbeat_interval_s:
            if fresh is not None:
                self._store(s, fresh)  # idle: the post-batch token still advances
            else:
                self._renew(s.grant)
        elif fresh is not None:
            self._unstored = fresh  # e.g. the end of a rescan: stored at the latest when the session ends

    # ---- writes to the lease document ---------------------------------------------------------

    def _store(self, s: Session, token: Token) -> None:
        """Store `token`; called only once every event it covers was acknowledged by Kafka."""
        self._lease.store_checkpoint(s.grant, token, self._fingerprint)
        self._last_write = self._clock.monotonic()
        self._last_token, self._unstored = token, None
        self.observer.checkpoint_stored(token)
        log.debug("checkpoint %s fencing=%d", short_token(token), s.grant.fencing_token)

    def _renew(self, grant: Grant) -> None:
        self._lease.renew(grant)
        self._last_write = self._clock.monotonic()

    def _heartbeat(self, grant: Grant) -> None:
        """Runs while waiting on Kafka: keep the lease alive so a slow broker is not a takeover."""
        self.observer.tick()
        if self._clock.monotonic() - self._last_write >= self.config.heartbeat_interval_s:
            self._renew(grant)

    # ---- outcomes -------------------------------------------------------------------------------

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

    def _restart(self, exc: Exception, at_once: bool = False) -> None:
        """Drop the stream and the producer; the next pass reopens from the checkpoint. The
        first restart after progress is immediate, later ones back off exponentially."""
        self._close_session()
        delay = 0.0 if at_once or self._failures == 0 else self._delay(self._failures)
        self._failures += 1
        self.observer.restart(exc, delay)
        self._clock.wait(delay, self._stopping)

    def _reopen(self, exc: ReopenableStreamError) -> None:
        if self._repeat_code == exc.code:
            raise RepeatedStreamError(
                f"{exc}; it repeated after reopening from the checkpoint, so the relay stops"
            ) from exc
        self._repeat_code = exc.code
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
        self._restart(exc, at_once=True)

    def _standby(self, exc: Exception) -> None:
        self._close_session()
        self._assignment.led(False)
        self.observer.lease_lost(exc)
        if self.config.on_lease_lost == "exit":
            raise exc
        self._role = "standby"
        self.observer.role("standby", None)

    def _stop(self, exc: Exception) -> None:
        raise exc

    def _delay(self, failures: int) -> float:
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = failures
        return float(self._backoff(state))

    # ---- shutdown -----------------------------------------------------------------------------

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.source.close()
            session.publisher.close()
            session.window.clear()

    def _finish(self) -> None:
        """Stopping: deliver and store what is in flight (a failure leaves it to the next leader)."""
        if self._session is None:
            return
        try:
            self._settle(self._session, keep=0)
            if self._unstored is not None:
                self._store(self._session, self._unstored)
        except Exception as exc:  # noqa: BLE001 - the next leader replays from the last checkpoint
            log.warning(
                "stopping without storing the last deliveries (%s); the next leader replays them from the checkpoint",
                exc,
            )

    def _shutdown(self) -> None:
        self._release()
        self._close()

    def _release(self) -> None:
        """Close the session and release its lease (a failure leaves it to expire)."""
        session = self._session
        self._close_session()
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

"""The relay loop: the only place that knows the order of steps.

One step (`_step`):
  1. read a batch of changes and the token that covers exactly them (changes.ChangeSource);
  2. build each Kafka message (encoding.MessageBuilder); a bad event stops the relay naming it;
  3. hand them to the producer (publisher.Publisher.send); up to RELAY_PIPELINE_DEPTH batches
     are in flight at once, so reading and encoding overlap with delivery, holding together at
     most RELAY_BATCH_MAX_EVENTS events (each read takes a slice of that);
  4. `_settle`: store, with a fenced majority write (lease.LeaseStore.commit), the token of the
     newest batch that Kafka acknowledged completely, along with every batch before it.
A token is stored only once every event before it was acknowledged (guarantee 1); a failed
report discards everything in flight and restarts from the stored token. An idle step first
settles everything in flight, then stores the post-batch token at most every heartbeat
interval (guarantee 7).

Around the steps: take the lease (standby until it is free), open the stream at the
checkpoint, and on a transient error drop the producer and the stream and start again from
the checkpoint, with exponential backoff (tenacity) while no progress is made.

Shutdown order, on `stop()`: finish the batch in flight (delivery reports, checkpoint); stop
reading; close the change stream; drop the producer (it holds nothing undelivered); release
the lease so a standby takes over at once; close the MongoDB client.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
import time
from typing import Any

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.server_api import ServerApi
from tenacity import Retrying, retry_if_exception, wait_exponential_jitter

from relay.changes import Batch, ChangeSource, StartPoint, oplog_start, pipeline_fingerprint, short_token
from relay.config import Settings
from relay.deadletter import dead_letter_message
from relay.encoding import MessageBuilder, OutgoingMessage, SchemaRegistry
from relay.errors import (
    Action, BatchRefusedError, HistoryLostError, PipelineMismatchError, PoisonEventError, ReopenableStreamError,
    RepeatedStreamError, ServerUnreachableError, TransientError, classify,
)
from relay.rescan import rescan_batches
from relay.lease import Checkpoint, Grant, LeaseStore
from relay.observe import Observer
from relay.publisher import InFlight, Publisher, check_config

log = logging.getLogger("relay")


def mongo_client(settings: Settings, **kw: Any) -> MongoClient[Any]:
    """The relay's MongoDB client: Stable API v1, bounded server selection."""
    # A socket timeout bounds every operation, so a frozen server turns into a restart (and
    # an unready relay) instead of a loop stuck forever in one getMore.
    return MongoClient(settings.mongodb_uri, server_api=ServerApi("1"), appname="outbox-relay",
                       serverSelectionTimeoutMS=int(settings.connect_timeout_s * 1000),
                       socketTimeoutMS=int(max(settings.connect_timeout_s, 10.0) * 1000),
                       tz_aware=True, **kw)


def check_mongodb(client: MongoClient[Any], settings: Settings) -> None:
    """Raise ServerUnreachableError unless MongoDB answers and is a replica set."""
    try:
        hello = client.admin.command("hello")
    except PyMongoError as exc:
        raise ServerUnreachableError(
            f"cannot reach MongoDB at {settings.mongodb_uri} within "
            f"{settings.connect_timeout_s:g}s (RELAY_MONGODB_URI): {str(exc).split(',')[0]}") from None
    if "setName" not in hello:
        raise ServerUnreachableError(
            f"MongoDB at {settings.mongodb_uri} is not a replica set member; change streams need one")


def check_kafka(settings: Settings) -> None:
    """Raise ServerUnreachableError unless a Kafka broker answers a metadata request."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**settings.kafka_client_config(), "log_level": 0,
                         "logger": logging.getLogger("kafka.admin")})
    try:
        if admin.list_topics(timeout=settings.connect_timeout_s).brokers:
            return
    except KafkaException:
        pass
    raise ServerUnreachableError(
        f"cannot reach Kafka at {settings.kafka_bootstrap_servers} within "
        f"{settings.connect_timeout_s:g}s (RELAY_KAFKA_BOOTSTRAP_SERVERS)")


class Relay:
    """Publishes one outbox collection to Kafka while it holds the lease."""

    def __init__(self, settings: Settings, observer: Observer | None = None,
                 registry: SchemaRegistry | None = None) -> None:
        self.settings = settings
        self.observer = observer or Observer(settings)
        self._stopping = threading.Event()
        self._client = mongo_client(settings)
        db = self._client[settings.database]
        self._outbox = db[settings.outbox_collection]
        self._lease = LeaseStore(db[settings.lease_collection], settings.namespace,
                                 settings.instance_id, settings.lease_ttl_s)
        self._builder = MessageBuilder(settings, registry or SchemaRegistry.bundled())
        self._fingerprint = pipeline_fingerprint(settings.namespace)
        self._grant: Grant | None = None
        self._last_write = 0.0
        self._last_token: Any = None
        self._repeat_code: int | None = None
        self._last_announce = 0.0
        # Events the broker refused for good (dead-letter policy): on replay they go to the
        # dead-letter topic instead. Event id -> reason.
        self._refused: dict[str, str] = {}
        # After a refused record batch, the next batch goes one message per request.
        self._isolate = False
        # Batches handed to the producer, oldest first, not yet acknowledged and stored, and
        # how many events they hold together (never more than batch_max_events).
        self._in_flight: deque[tuple[InFlight, Batch]] = deque()
        self._unacknowledged = 0
        self._slice = max(1, -(-settings.batch_max_events // settings.pipeline_depth))

    # ---- public -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the batch in flight and shut down (thread- and signal-safe)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        """Run until `stop()`; raises the error that made the relay stop (see errors.classify)."""
        check_config(self.settings)
        check_mongodb(self._client, self.settings)
        check_kafka(self.settings)
        log.info("relay %s watching %s, publishing to %s", self.settings.instance_id,
                 self.settings.namespace, self.settings.kafka_bootstrap_servers)
        try:
            while not self.stopping:
                try:
                    self._retrying()(self._cycle)
                except Exception as exc:
                    self.observer.error(exc)
                    if classify(exc) is not Action.STANDBY or self.settings.on_lease_lost == "exit":
                        raise
                    log.warning("%s; back to standby", exc)
                    self._grant = None
                    self.observer.role("standby", None)
        finally:
            self._shutdown()

    # ---- around the steps ---------------------------------------------------------------------

    def _retrying(self) -> Retrying:
        return Retrying(
            retry=retry_if_exception(lambda e: classify(e) is Action.RESTART),
            wait=wait_exponential_jitter(multiplier=0.2, max=self.settings.restart_backoff_max_s, jitter=0.2),
            sleep=self._stopping.wait, before_sleep=self._log_restart, reraise=True,
        )

    def _log_restart(self, state: Any) -> None:
        exc = state.outcome.exception()
        self.observer.restart(exc)
        log.warning("restarting from the checkpoint in %.1fs after: %s", state.upcoming_sleep, exc)

    def _cycle(self) -> None:
        """Take the lease (waiting as a standby), then lead until stopped or an error."""
        grant = self._await_lease()
        if grant is not None:
            self._lead(grant)

    def _await_lease(self) -> Grant | None:
        announced = False
        while not self.stopping:
            grant = self._lease.try_acquire()
            if grant is not None:
                self._grant = grant
                self._last_write = time.monotonic()  # acquiring renewed the lease
                self.observer.role("leader", grant.fencing_token)
                self._lease.announce("leader")
                log.info("holding the lease, fencing token %d", grant.fencing_token)
                return grant
            if not announced:
                log.info("standby: another replica holds the lease on %s", self.settings.namespace)
                self.observer.role("standby", None)
                announced = True
            self._lease.announce("standby")
            self.observer.tick()
            self._stopping.wait(self.settings.standby_poll_s)
        return None

    def _start_point(self, checkpoint: Checkpoint) -> StartPoint:
        if checkpoint.token is not None:
            if checkpoint.fingerprint not in (None, self._fingerprint):
                raise PipelineMismatchError(
                    f"the stored checkpoint was made by a different change stream pipeline "
                    f"(fingerprint {checkpoint.fingerprint}, now {self._fingerprint}); resuming "
                    "could skip or repeat events. Reset the checkpoint (`outbox-relay checkpoint "
                    "reset`) and set RELAY_START_AT to continue")
            return StartPoint(resume_after=checkpoint.token)
        if self.settings.start_at == "now":
            return StartPoint()
        moment = self.settings.start_at_time()
        if moment is not None:
            return StartPoint(at_time=Timestamp(int(moment.timestamp()), 0))
        return StartPoint(at_time=oplog_start(self._client))

    def _lead(self, grant: Grant) -> None:
        """Publish batches while holding the lease; returns when stopping.

        A transient error after progress returns too (the next cycle restarts at once from
        the new checkpoint); before any progress it propagates to the backoff.
        """
        s = self.settings
        start = self._start_point(grant.checkpoint)
        source = ChangeSource(self._outbox, s.max_await_ms, s.batch_max_events)
        publisher = Publisher(s)
        self.observer.watch_publisher(publisher)
        progressed = False
        self._in_flight.clear()
        self._unacknowledged = 0
        try:
            try:
                source.open(start)
            except HistoryLostError:
                if grant.checkpoint.token is None and self.settings.start_at == "oplog-start":
                    # The oldest oplog entry was truncated between reading and opening: retry.
                    raise TransientError("the oplog rolled over while opening at its start") from None
                if self.settings.on_history_lost != "rescan":
                    raise
                self._rescan(source, publisher, grant)
            log.info("change stream opened %s", start.description)
            if grant.checkpoint.token is None and source.token is not None:
                # No checkpoint yet: store the opening position at once, so a crash before the
                # first batch cannot move the start to a later "now" (blog post, Fig. 4b).
                self._commit(source.token)
            while not self.stopping:
                progressed |= self._step(source, publisher, grant)
                if progressed:
                    self._repeat_code = None
            self._settle(publisher, keep=0)  # stopping: deliver and store what is in flight
        except Exception as exc:
            if isinstance(exc, PoisonEventError) and self.settings.on_poison == "dead-letter" \
                    and exc.event_id not in self._refused:
                # The broker refused the event for good: replay the batch from the checkpoint,
                # this time with the event on the dead-letter topic.
                self._refused[exc.event_id] = exc.reason
                log.error("event %s refused by the broker (%s): dead-lettering it on replay",
                          exc.event_id, exc.reason, extra={"event_id": exc.event_id})
                return
            if isinstance(exc, BatchRefusedError):
                self._isolate = True
            if isinstance(exc, ReopenableStreamError) and not progressed:
                if self._repeat_code == exc.code:
                    raise RepeatedStreamError(f"{exc}; it repeated after reopening from the "
                                              "checkpoint, so the relay stops") from exc
                self._repeat_code = exc.code
            if progressed and classify(exc) is Action.RESTART:
                self.observer.restart(exc)
                log.warning("restarting from the checkpoint after: %s", exc)
                return
            raise
        finally:
            source.close()
            publisher.close()

    # ---- one step ---------------------------------------------------------------------------

    def _step(self, source: ChangeSource, publisher: Publisher, grant: Grant) -> bool:
        """Read and send one batch, then store what is acknowledged; True when a checkpoint
        covering new events was stored."""
        s = self.settings
        self.observer.tick()
        # At most batch_max_events events are ever unacknowledged: that bounds memory and what
        # a replica that lost its lease can still publish late. They are read in slices so
        # reading and encoding overlap with delivery.
        room = s.batch_max_events - self._unacknowledged
        if room < self._slice:
            self._settle(publisher, keep=len(self._in_flight) - 1)
            room = s.batch_max_events - self._unacknowledged
        batch = source.next_batch(min(room, self._slice))
        if batch.resumed:
            self.observer.resumed()
        if batch.changes:
            # A replica that was paused learns here that it lost the lease, before publishing.
            self._heartbeat()
            messages = self._messages(batch.changes, grant, s.batch_max_bytes)
            if len(messages) < len(batch.changes):
                # Over the byte limit: send the head; its last change's own token covers it.
                source.unread(batch.changes[len(messages):], batch.token)
                batch = Batch(batch.changes[:len(messages)], batch.changes[len(messages) - 1]["_id"],
                              batch.resumed)
            if self._isolate:  # after a refused record batch: one message per request
                self._settle(publisher, keep=0)
                started = time.monotonic()
                publisher.publish(messages, while_waiting=self._heartbeat, one_by_one=True)
                self._isolate = False
                self._commit(batch.token)
                self.observer.published(batch, messages, time.monotonic() - started, batch.token)
                return True
            sent = publisher.send(messages, batch.token, time.monotonic(), self._heartbeat)
            self._in_flight.append((sent, batch))
            self._unacknowledged += len(messages)
            return self._settle(publisher, keep=s.pipeline_depth - 1)
        # Idle: everything sent is acknowledged and stored first, then the post-batch token.
        progressed = self._settle(publisher, keep=0)
        if time.monotonic() - self._last_write >= s.heartbeat_interval_s:
            if batch.token is not None and batch.token != self._last_token:
                self._commit(batch.token)  # idle: the post-batch token still advances
            else:
                self._renew()
        return progressed

    def _settle(self, publisher: Publisher, keep: int) -> bool:
        """Store the token of the newest batch that is acknowledged along with every batch
        before it; first wait until at most `keep` batches remain in flight.

        This is where guarantee 1 holds: a token is stored only once every delivery report
        up to it succeeded. A failed report raises (the caller restarts from the checkpoint).
        """
        publisher.serve(0)
        newest = None
        while self._in_flight:
            sent, batch = self._in_flight[0]
            if not sent.done and len(self._in_flight) <= keep:
                break
            publisher.wait(sent, self._heartbeat)  # returns at once when done; raises a failure
            self._in_flight.popleft()
            self._unacknowledged -= len(sent.messages)
            self.observer.published(batch, sent.messages, time.monotonic() - sent.sent_at, sent.token)
            newest = sent
        if newest is None:
            return False
        self._commit(newest.token)
        return True

    def _messages(self, changes: list[Any], grant: Grant, max_bytes: int | None = None) -> list[OutgoingMessage]:
        """The Kafka messages for `changes`, in order, stopping once they hold `max_bytes` (at
        least one message); poison events stop the relay or become dead letters."""
        messages: list[OutgoingMessage] = []
        size = 0
        for change in changes:
            if max_bytes is not None and size >= max_bytes:
                break
            try:
                if self._refused:
                    event_id = str(change["fullDocument"].get("_id"))
                    if event_id in self._refused:
                        raise PoisonEventError(event_id, self._refused[event_id])
                messages.append(self._builder.build(change, grant.fencing_token))
                size += len(messages[-1].value)
            except PoisonEventError as exc:
                if self.settings.on_poison != "dead-letter":
                    raise
                log.error("dead-lettering event %s to %s: %s", exc.event_id,
                          self.settings.dead_letter_topic, exc.reason, extra={"event_id": exc.event_id})
                self.observer.dead_lettered(exc)
                messages.append(dead_letter_message(change, exc.reason, grant.fencing_token, self.settings))
        return messages

    def _rescan(self, source: ChangeSource, publisher: Publisher, grant: Grant) -> None:
        """History lost, operator chose rescan (see relay.rescan): publish every outbox document,
        then store the token of a stream opened before the scan."""
        log.error("the checkpoint fell off the oplog; RELAY_ON_HISTORY_LOST=rescan: re-publishing "
                  "every document in %s (expect duplicates)", self.settings.namespace)
        source.close()
        source.open(StartPoint())
        opening = source.token
        if opening is None:
            raise TransientError("no opening token for the stream after the rescan; retrying")
        count = 0
        for changes in rescan_batches(self._outbox, self.settings.field_occurred_at,
                                      self.settings.batch_max_events):
            publisher.publish(self._messages(changes, grant), while_waiting=self._heartbeat)
            count += len(changes)
        self._commit(opening)
        log.warning("rescan published %d outbox documents; continuing from the change stream", count)

    def _commit(self, token: Any) -> None:
        assert self._grant is not None
        self._lease.commit(self._grant, token, self._fingerprint)
        self._last_write = time.monotonic()
        self._last_token = token
        self.observer.committed(token)
        log.debug("checkpoint %s fencing=%d", short_token(token), self._grant.fencing_token)

    def _renew(self) -> None:
        assert self._grant is not None
        self._lease.renew(self._grant)
        self._last_write = time.monotonic()
        self._lease.announce("leader")

    def _heartbeat(self) -> None:
        """Runs while waiting on Kafka: keep the lease alive so a slow broker is not a takeover."""
        self.observer.tick()
        if time.monotonic() - self._last_write >= self.settings.heartbeat_interval_s:
            self._renew()

    def _shutdown(self) -> None:
        if self._grant is not None:
            try:
                self._lease.release(self._grant)
                log.info("lease released (fencing token %d)", self._grant.fencing_token)
            except PyMongoError as exc:
                log.warning("could not release the lease (it will expire): %s", exc)
            self._grant = None
        self._client.close()

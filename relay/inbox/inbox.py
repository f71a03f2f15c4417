"""`Inbox`: the one place that knows the order of the steps (gather, decode, apply, commit).

One iteration (`_step`): gather a batch from Kafka; decode it; apply it up to its first poison
message in one MongoDB transaction (handler calls and inbox records together); commit its Kafka
offsets; then the poison policy for that message, and the same for the rest of the batch.

Shutdown order (SIGTERM, SIGINT or `stop()`): stop gathering; finish the batch in hand (its
transaction and its offset commit); close the consumer, which leaves the group so the partitions
move at once; flush the dead-letter producer. A batch whose transaction cannot commit (MongoDB
unreachable past pymongo's retries, relay.inbox.store.retryable) is retried with backoff; nothing of it is committed to Kafka
until it succeeds, and a stop during the wait leaves it to the next consumer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from relay.avro.folder import SchemaFolder
from relay.inbox.batching import BatchLimits, Poisoned, offsets_to_commit, split_at_poison
from relay.inbox.config import RunOptions
from relay.inbox.consumer import KafkaSource, Received
from relay.inbox.deadletters import DeadLetterSender
from relay.inbox.decoding import EventDecoder, UndecodableMessageError
from relay.inbox.event import InboxEvent
from relay.inbox.metrics import InboxMetrics
from relay.inbox.poison import log_dead_letter, stop_at
from relay.inbox.store import DEFAULT_RETENTION, Handler, HandlerError, InboxStore, retryable

log = logging.getLogger("relay.inbox")
Item = InboxEvent | Poisoned


class Inbox:
    """Exactly-once effects for a consumer whose state is in MongoDB.

    `collection` holds the inbox records (one per event and consumer group; several services may
    share it). Options: `retention` (how long a record is kept, a timedelta or seconds, default
    7 days: a TTL index the inbox creates or changes), `registry` (a prometheus_client CollectorRegistry for the metrics;
    a new one by default, see `registry`), `schema_folder` (the writer schemas; default the
    bundled `schemas/`).
    """

    def __init__(
        self,
        collection: Collection[Any],
        *,
        retention: dt.timedelta | float = DEFAULT_RETENTION,
        registry: Any = None,
        schema_folder: SchemaFolder | None = None,
    ) -> None:
        self.collection = collection
        self.retention = retention
        self.metrics = InboxMetrics(registry)
        self._folder = schema_folder
        self._stop = threading.Event()

    @property
    def registry(self) -> Any:
        """The CollectorRegistry holding the inbox's metrics."""
        return self.metrics.registry

    def stop(self) -> None:
        """Ask `run` to return after the batch in hand (safe from any thread or a signal handler)."""
        self._stop.set()

    def run(
        self, handler: Handler, *, topics: Sequence[str] | str, group_id: str, bootstrap_servers: str, **options: Any
    ) -> None:
        """Consume `topics` as `group_id`, calling `handler(event, session)` inside a MongoDB
        transaction once per event, ever; blocks until SIGTERM/SIGINT (in the main thread) or
        `stop()`. Raises InboxPoisonError at a poison event under `on_poison="stop"`, and
        ConfigError for a bad option (relay.inbox.config.RunOptions lists them)."""
        opts = RunOptions.of(topics, group_id, bootstrap_servers, options)
        store = InboxStore(self.collection, group_id, self.retention)
        store.ensure_indexes()
        self._stop.clear()
        dead_letters = DeadLetterSender(opts) if opts.on_poison == "dead-letter" else None
        parts = Parts(KafkaSource(opts), EventDecoder(self._folder, opts.schema_registry_url), store, dead_letters)
        run = Steps(self.metrics, self._stop, opts, parts, handler)
        log.info("inbox consuming %s as group %s", ",".join(opts.topics), group_id, extra={"group": group_id})
        with _signals(self.stop), self.collection.database.client.start_session() as session:
            try:
                while not self._stop.is_set():
                    run.step(session)
            finally:
                run.close()
        log.info("inbox stopped", extra={"group": group_id})


@dataclass(frozen=True)
class Parts:
    """The boundaries one `run` call uses (fakes in tests/unit/test_inbox_steps.py)."""

    source: KafkaSource
    decoder: EventDecoder
    store: InboxStore
    dead_letters: DeadLetterSender | None


class Steps:
    """One `run` call's steps over its parts: `step` is one batch, `close` the end."""

    def __init__(
        self, metrics: InboxMetrics, stop: threading.Event, options: RunOptions, parts: Parts, handler: Handler
    ) -> None:
        self.metrics, self.stop, self.options, self.handler = metrics, stop, options, handler
        self.limits = BatchLimits(options.batch_max_events, options.batch_max_ms / 1000)
        self.source, self.decoder, self.store = parts.source, parts.decoder, parts.store
        self.dead_letters = parts.dead_letters
        self.received: dict[tuple[str, int, int], Received] = {}

    def step(self, session: ClientSession) -> None:
        """One batch: gathered, decoded, applied up to each poison message, committed."""
        batch = self.source.gather(self.limits, self.stop)
        self.received = {(m.topic, m.partition, m.offset): m for m in batch}
        items: list[Item] = [self._decode(m) for m in batch]
        while items:
            events, poisoned, rest = split_at_poison(items)
            applied, handler_poison, after = self._apply(session, events)
            self._commit(applied)
            if handler_poison is not None:
                poisoned, rest = handler_poison, [*after, *([poisoned] if poisoned else []), *rest]
            if poisoned is None:
                break
            self.metrics.totals["poison"] += 1
            self._poison(session, poisoned)
            items = rest
        self.metrics.summarize(self.options.group_id)

    def _decode(self, msg: Received) -> Item:
        headers = msg.headers
        try:
            return self.decoder.decode(msg.topic, msg.partition, msg.offset, msg.value, headers)
        except UndecodableMessageError as exc:
            self.metrics.undecodable.labels(msg.topic).inc()
            return Poisoned(msg.topic, msg.partition, msg.offset, headers.get("ce_id"), f"cannot decode: {exc}")

    def _apply(
        self, session: ClientSession, events: list[InboxEvent]
    ) -> tuple[list[InboxEvent], Poisoned | None, list[InboxEvent]]:
        """Apply `events` in one transaction; when the handler raises for one, apply the events
        before it instead. Returns (applied, the poison event or None, the events after it)."""
        try:
            self._transaction(session, events)
            return events, None, []
        except HandlerError as exc:
            self.metrics.handler_errors.labels(exc.event.topic).inc()
            index = events.index(exc.event)
            applied, poisoned, after = self._apply(session, events[:index])
            e = exc.event
            failed = Poisoned(e.topic, e.partition, e.offset, e.event_id, str(exc))
            if poisoned is not None:  # the handler failed earlier this time: stop there
                return applied, poisoned, [*after, *events[index:]]
            return applied, failed, events[index + 1 :]

    def _transaction(self, session: ClientSession, events: list[InboxEvent]) -> None:
        """One committed transaction for `events`, retried with backoff past database outages."""
        if not events:
            return
        delay = 0.1
        while True:
            started = time.monotonic()
            try:
                applied = self.store.apply(session, events, self.handler)
            except PyMongoError as exc:
                if self.stop.is_set() or not retryable(exc):
                    raise
                log.warning("batch transaction failed, retrying in %.1fs: %s", delay, exc, extra={"cause": str(exc)})
                self.metrics.retries.inc()
                self.stop.wait(delay)
                delay = min(delay * 2, self.options.retry_backoff_max_s)
                continue
            self.metrics.applied(applied.ran, applied.skipped, applied.attempts)
            self.metrics.batch_seconds.observe(time.monotonic() - started)
            return

    def _commit(self, applied: Sequence[InboxEvent | Poisoned]) -> None:
        offsets = offsets_to_commit(applied)
        if offsets and self.source.commit(offsets):
            for (topic, partition), offset in offsets.items():
                end = self.source.end_offset(topic, partition)
                if end is not None:
                    self.metrics.set_lag(topic, partition, end - offset)

    def _poison(self, session: ClientSession, poisoned: Poisoned) -> None:
        """The policy for one poison message: raise under `stop`, else dead-letter it and go on."""
        if self.dead_letters is None:
            raise stop_at(poisoned)
        log_dead_letter(poisoned, self.options.dead_letter_topic)
        self.dead_letters.send(poisoned, self.received[(poisoned.topic, poisoned.partition, poisoned.offset)])
        if poisoned.event_id is not None:
            self.store.record_dead_letter(
                session, poisoned.event_id, (poisoned.topic, poisoned.partition, poisoned.offset)
            )
        self.metrics.dead_letters.labels(poisoned.topic).inc()
        self._commit([poisoned])

    def close(self) -> None:
        self.metrics.summarize(self.options.group_id, force=True)
        try:
            self.source.close()
        finally:
            if self.dead_letters is not None:
                self.dead_letters.close()


@contextlib.contextmanager
def _signals(stop: Any) -> Iterator[None]:
    """SIGTERM and SIGINT call `stop` while the block runs (main thread only; restored after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

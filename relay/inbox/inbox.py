"""`Inbox`: the one place that knows the order of the steps (gather, decode, apply, commit).

One iteration (`Steps.step`): gather a batch from Kafka; decode it; apply it up to its first
poison message in one MongoDB transaction (handler calls and inbox records together); commit its
Kafka offsets; then the poison policy for that message, and the same for the rest of the batch;
last, the lag of the assigned partitions.

A batch that fails on a transient error (relay.inbox.errors.retryable: a database outage past
pymongo's own retries, a Schema Registry that cannot be reached while decoding) is run again
whole, with backoff up to `retry_backoff_max_s`: the same events in the same order, nothing of it
committed to Kafka until it succeeds. A stop asked meanwhile ends the wait: the batch is left
uncommitted (the next consumer reads it again) and `run` returns.

Shutdown order (SIGTERM, SIGINT or `stop()`): stop gathering; finish the batch in hand (its
transaction and its offset commit); close the consumer, which leaves the group so the partitions
move at once; flush the dead-letter producer. Every client `run` opens is closed however it ends,
also when opening a later one fails.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from relay.avro.folder import SchemaFolder
from relay.core.errors import SchemaRegistryUnavailableError
from relay.inbox.batching import BatchLimits, Poisoned, offsets_to_commit, split_at_poison
from relay.inbox.config import RunOptions
from relay.inbox.consumer import KafkaSource, Received
from relay.inbox.deadletters import DeadLetterSender
from relay.inbox.decoding import EventDecoder, UndecodableMessageError
from relay.inbox.errors import retryable
from relay.inbox.event import InboxEvent
from relay.inbox.metrics import InboxMetrics, series_on
from relay.inbox.poison import log_dead_letter, stop_at
from relay.inbox.store import DEFAULT_RETENTION, Handler, HandlerError, InboxStore

log = logging.getLogger("relay.inbox")
Item = InboxEvent | Poisoned
T = TypeVar("T")


class Inbox:
    """Exactly-once effects for a consumer whose state is in MongoDB.

    `collection` holds the inbox records (one per event and consumer group; several services may
    share it). Options: `retention` (how long a record is kept, a timedelta or seconds, default
    7 days: a TTL index the inbox creates or changes), `registry` (a prometheus_client
    CollectorRegistry for the metrics, e.g. the service's own or `prometheus_client.REGISTRY`; a
    new one by default; several inboxes may share one, their series labelled by `group`),
    `schema_folder` (the writer schemas; default the bundled `schemas/`).
    """

    def __init__(
        self,
        collection: Collection[Any],
        *,
        retention: dt.timedelta | float = DEFAULT_RETENTION,
        registry: CollectorRegistry | None = None,
        schema_folder: SchemaFolder | None = None,
    ) -> None:
        self.collection = collection
        self.retention = retention
        self.registry = registry if registry is not None else CollectorRegistry()
        series_on(self.registry)  # registered now, shared with any other inbox on this registry
        self._folder = schema_folder
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask `run` to return after the batch in hand (safe from any thread or a signal handler).
        Asked before `run` began, it makes that `run` return at once."""
        self._stop.set()

    def run(
        self, handler: Handler, *, topics: Sequence[str] | str, group_id: str, bootstrap_servers: str, **options: Any
    ) -> None:
        """Consume `topics` as `group_id`, calling `handler(event, session)` inside a MongoDB
        transaction once per event, ever; blocks until SIGTERM/SIGINT (in the main thread) or
        `stop()`, then returns. Raises InboxPoisonError at a poison event under `on_poison="stop"`,
        ConfigError for a bad option (relay.inbox.config.RunOptions lists them), and any error
        that is neither poison nor retryable (relay.inbox.errors)."""
        opts = RunOptions.of(topics, group_id, bootstrap_servers, options)
        try:
            with _signals(self.stop), contextlib.ExitStack() as resources:
                steps = self._open(opts, handler, resources)
                session = resources.enter_context(self.collection.database.client.start_session())
                log.info("inbox consuming %s as group %s", ",".join(opts.topics), group_id, extra={"group": group_id})
                while not self._stop.is_set():
                    steps.step(session)
        finally:
            self._stop.clear()  # this run has ended: the next one starts afresh
        log.info("inbox stopped", extra={"group": group_id})

    def _open(self, opts: RunOptions, handler: Handler, resources: contextlib.ExitStack) -> Steps:
        """The run's parts; each one opened is closed by `resources` (in reverse order) however
        the run ends, also when opening the next one fails."""
        store = InboxStore(self.collection, opts.group_id, self.retention)
        store.ensure_indexes()
        decoder = EventDecoder(self._folder, opts.schema_registry_url, opts.schema_registry_basic_auth)
        dead_letters = None
        if opts.on_poison == "dead-letter":
            dead_letters = DeadLetterSender(opts)
            resources.callback(dead_letters.close)
        source = KafkaSource(opts)
        resources.callback(source.close)
        steps = Steps(
            InboxMetrics(self.registry, opts.group_id),
            self._stop,
            opts,
            InboxParts(source, decoder, store, dead_letters),
            handler,
        )
        resources.callback(steps.close)
        return steps


@dataclass(frozen=True)
class InboxParts:
    """The boundaries one `run` call uses (fakes in tests/unit/test_inbox_steps.py)."""

    source: KafkaSource
    decoder: EventDecoder
    store: InboxStore
    dead_letters: DeadLetterSender | None


class StopRequested(Exception):
    """Raised inside a step when `stop()` was asked while its batch waited to be retried: the
    batch is left uncommitted, for the next consumer to read again."""


class Steps:
    """One `run` call's steps over its parts: `step` is one batch, `close` the end."""

    def __init__(
        self, metrics: InboxMetrics, stop: threading.Event, options: RunOptions, parts: InboxParts, handler: Handler
    ) -> None:
        self.metrics, self.stop, self.options, self.handler = metrics, stop, options, handler
        self.limits = BatchLimits(options.batch_max_events, options.batch_max_ms / 1000)
        self.source, self.decoder, self.store = parts.source, parts.decoder, parts.store
        self.dead_letters = parts.dead_letters
        self.received: dict[tuple[str, int, int], Received] = {}

    def step(self, session: ClientSession) -> None:
        """One batch: gathered, decoded, applied up to each poison message, committed."""
        batch = self.source.gather(self.limits, self.stop)
        try:
            self._process(session, batch)
        except StopRequested as stopped:
            log.warning(
                "stopping with a batch of %d messages left uncommitted (it is read again): %s",
                len(batch),
                stopped.__cause__,
                extra={"cause": str(stopped.__cause__)},
            )
        self.metrics.set_lags(self.source.lags())
        self.metrics.summarize()

    def _process(self, session: ClientSession, batch: list[Received]) -> None:
        self.received = {(m.topic, m.partition, m.offset): m for m in batch}
        items = self._retrying(lambda: [self._decode(m) for m in batch])
        for item in items:
            if isinstance(item, Poisoned):
                self.metrics.poison(item.topic, "undecodable")
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

    def _decode(self, msg: Received) -> Item:
        """The event in `msg`, or a poison item when the message is at fault; a registry that
        cannot be reached raises (the batch is decoded again, relay.inbox.errors)."""
        headers = msg.headers
        try:
            return self.decoder.decode(msg.topic, msg.partition, msg.offset, msg.value, headers)
        except UndecodableMessageError as exc:
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
            self.metrics.poison(exc.event.topic, "handler_errors")
            index = events.index(exc.event)
            applied, poisoned, after = self._apply(session, events[:index])
            e = exc.event
            failed = Poisoned(e.topic, e.partition, e.offset, e.event_id, str(exc))
            if poisoned is not None:  # the handler failed earlier this time: stop there
                return applied, poisoned, [*after, *events[index:]]
            return applied, failed, events[index + 1 :]

    def _transaction(self, session: ClientSession, events: list[InboxEvent]) -> None:
        """One committed transaction for `events` (retried past database outages)."""
        if not events:
            return
        started = time.monotonic()
        applied = self._retrying(lambda: self.store.apply(session, events, self.handler))
        self.metrics.applied(applied.ran, applied.skipped, applied.attempts)
        self.metrics.batch_seconds.observe(time.monotonic() - started)

    def _retrying(self, attempt: Callable[[], T]) -> T:
        """`attempt()` again, with backoff, after each retryable failure (relay.inbox.errors);
        raises StopRequested when `stop()` is asked meanwhile. Other errors propagate."""
        delay = 0.1
        while True:
            try:
                return attempt()
            except Exception as exc:
                if not retryable(exc):
                    raise
                if self.stop.is_set():
                    raise StopRequested from exc
                cause = "registry" if isinstance(exc, SchemaRegistryUnavailableError) else "transaction"
                log.warning("batch %s failed, retrying in %.1fs: %s", cause, delay, exc, extra={"cause": str(exc)})
                self.metrics.retried(cause)
                if self.stop.wait(delay):
                    raise StopRequested from exc
                delay = min(delay * 2, self.options.retry_backoff_max_s)

    def _commit(self, applied: Sequence[InboxEvent | Poisoned]) -> None:
        self.source.commit(offsets_to_commit(applied))

    def _poison(self, session: ClientSession, poisoned: Poisoned) -> None:
        """The policy for one poison message: raise under `stop`, else dead-letter it and go on."""
        if self.dead_letters is None:
            raise stop_at(poisoned)
        log_dead_letter(poisoned, self.options.dead_letter_topic)
        self.dead_letters.send(poisoned, self.received[(poisoned.topic, poisoned.partition, poisoned.offset)])
        if poisoned.event_id is not None:
            where = (poisoned.topic, poisoned.partition, poisoned.offset)
            event_id = poisoned.event_id
            self._retrying(lambda: self.store.record_dead_letter(session, event_id, where))
        self.metrics.poison(poisoned.topic, "dead_letters")
        self._commit([poisoned])

    def close(self) -> None:
        """The last summary line; the lag series of this run removed."""
        self.metrics.set_lags({})
        self.metrics.summarize(force=True)


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

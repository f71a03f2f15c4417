"""`Inbox`: the sync inbox's run (its parts opened and closed, its loop) and the driver of its steps.

One iteration (`Steps.step`): gather a batch from Kafka; decode it; then the batch's steps in the
order relay.inbox.steps writes once for both inboxes (apply up to each poison message in one
MongoDB transaction, commit its offsets, the poison policy, the rest), each done here with a
blocking call; last, the lag of the assigned partitions. The async form is relay.inbox.async_inbox.

A batch that fails on a transient error (relay.inbox.errors.retryable: a database outage past
pymongo's own retries, a Schema Registry that cannot be reached while decoding) is run again
whole, with backoff up to `retry_backoff_max_s` (relay.inbox.retrying): the same events in the
same order, nothing of it committed to Kafka until it succeeds. A stop asked meanwhile ends the
wait: the batch is left uncommitted (the next consumer reads it again) and `run` returns.

Shutdown order (SIGTERM, SIGINT or `stop()`): stop gathering; finish the batch in hand (its
transaction and its offset commit); close the consumer, which leaves the group so the partitions
move at once; flush the dead-letter producer. Every client `run` opens is closed however it ends,
also when opening a later one fails.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from relay.avro.folder import SchemaFolder
from relay.core.signals import stopping_on_signals
from relay.inbox.config import RunOptions
from relay.inbox.decoding import EventDecoder
from relay.inbox.metrics import InboxMetrics, series_on
from relay.inbox.records import DEFAULT_RETENTION
from relay.inbox.sources import DeadLetters, MessageSource, open_dead_letters, open_source
from relay.inbox.steps import Action, Apply, BatchSteps, Commit, SendDeadLetter, decode_all, drive
from relay.inbox.stopping import StopRequested, StopSignal
from relay.inbox.store import Handler, InboxStore
from relay.outbox.writer import require_sync_collection

log = logging.getLogger("relay.inbox")


def is_async_callable(handler: object) -> bool:
    """Whether calling `handler` gives an awaitable: an `async def` function (or partial of one),
    or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__)


class InboxBase:
    """What both inboxes hold between runs: the collection, the retention, the metrics' registry,
    the schema folder, the stop signal."""

    def __init__(
        self,
        collection: Any,
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
        self._stop = StopSignal()

    def stop(self) -> None:
        """Ask `run` to return after the batch in hand (safe from any thread or a signal handler).
        Asked before `run` began, it makes that `run` return at once."""
        self._stop.set()

    def _decoder(self, opts: RunOptions) -> EventDecoder:
        return EventDecoder(self._folder, opts.schema_registry_url, opts.schema_registry_basic_auth)


class Inbox(InboxBase):
    """Exactly-once effects for a consumer whose state is in MongoDB (PyMongo's synchronous API;
    asyncio services use relay.inbox.AsyncInbox, which shares its records and its rules).

    `collection` holds the inbox records (one per event and consumer group; several services may
    share it); an AsyncCollection raises TypeError. Options: `retention` (how long a record is
    kept, a timedelta or seconds, default 7 days: a TTL index the inbox creates or changes),
    `registry` (a prometheus_client CollectorRegistry for the metrics, e.g. the service's own or
    `prometheus_client.REGISTRY`; a new one by default; several inboxes may share one, their
    series labelled by `group`), `schema_folder` (the writer schemas; default the bundled
    `schemas/`).
    """

    def __init__(
        self,
        collection: Collection[Any],
        *,
        retention: dt.timedelta | float = DEFAULT_RETENTION,
        registry: CollectorRegistry | None = None,
        schema_folder: SchemaFolder | None = None,
    ) -> None:
        require_sync_collection(collection, "Inbox", "relay.inbox.AsyncInbox")
        super().__init__(collection, retention=retention, registry=registry, schema_folder=schema_folder)

    def run(
        self,
        handler: Handler,
        *,
        topics: Sequence[str] | str,
        group_id: str,
        bootstrap_servers: str | None = None,
        **options: Any,
    ) -> None:
        """Consume `topics` as `group_id`, calling `handler(event, session)` inside a MongoDB
        transaction once per event, ever (from Kafka's `bootstrap_servers`, NATS JetStream's
        `nats_servers=` option: relay.inbox.jetstream, or the RabbitMQ queue `topics=[QUEUE]` with
        `rabbitmq_url=`: relay.inbox.rabbitmq); blocks until SIGTERM/SIGINT (in the main thread) or
        `stop()`, then returns. Raises InboxPoisonError at a poison event under `on_poison="stop"`,
        ConfigError for a bad option (relay.inbox.config.RunOptions lists them), and any error
        that is neither poison nor retryable (relay.inbox.errors); TypeError for an `async def`
        handler (AsyncInbox runs those)."""
        if is_async_callable(handler):
            raise TypeError(
                "Inbox.run calls handler(event, session) as a plain function; an async def handler "
                "needs relay.inbox.AsyncInbox over an AsyncCollection"
            )
        opts = RunOptions.of(topics, group_id, bootstrap_servers, options)
        try:
            with stopping_on_signals(self.stop), contextlib.ExitStack() as resources:
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
        decoder = self._decoder(opts)
        dead_letters = None
        if opts.on_poison == "dead-letter":
            dead_letters = open_dead_letters(opts)
            resources.callback(dead_letters.close)
        source = open_source(opts)
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

    source: MessageSource
    decoder: EventDecoder
    store: InboxStore
    dead_letters: DeadLetters | None


class Steps(BatchSteps):
    """One `run` call's steps over its parts, each action a blocking call: `step` is one batch,
    `close` the end."""

    def __init__(
        self, metrics: InboxMetrics, stop: StopSignal, options: RunOptions, parts: InboxParts, handler: Handler
    ) -> None:
        super().__init__(metrics, stop, options)
        self.handler = handler
        self.source, self.decoder, self.store = parts.source, parts.decoder, parts.store
        self.dead_letters = parts.dead_letters

    def step(self, session: ClientSession) -> None:
        """One batch: gathered, decoded, applied up to each poison message, committed."""
        batch = self.source.gather(self.limits, self.stop)
        try:
            items = self.retry.call(lambda: decode_all(self.decoder, batch))
            drive(self.steps(batch, items), lambda action: self._do(session, action))
        except StopRequested as stopped:
            self.abandoned(batch, stopped)
        self.after_step(self.source.lags())

    def _do(self, session: ClientSession, action: Action) -> Any:
        if isinstance(action, Apply):
            return self.retry.call(lambda: self.store.apply(session, action.events, self.handler))
        if isinstance(action, Commit):
            return self.source.commit(action.offsets)
        if isinstance(action, SendDeadLetter):
            assert self.dead_letters is not None  # only yielded under the dead-letter policy
            return self.dead_letters.send(action.poisoned, action.message)
        return self.retry.call(
            lambda: self.store.record_dead_letter(session, action.event_id, action.where, action.event)
        )

"""`AsyncInbox`: the inbox for asyncio services, with the sync inbox's contract and rules.

    async def handle(event, session):     # session: AsyncClientSession, inside the transaction
        await db.shipments.update_one({"_id": event.aggregate_id},
                                      {"$push": {"orders": event.payload}}, upsert=True, session=session)

    inbox = AsyncInbox(db.inbox)           # db from an AsyncMongoClient
    loop.add_signal_handler(signal.SIGTERM, inbox.stop)
    await inbox.run(handle, topics=["outbox.event.order"], group_id="shipping",
                    bootstrap_servers="localhost:9092")

The steps of a batch are relay.inbox.steps', the same as the sync inbox's; `AsyncSteps` does each
action without blocking the event loop:

- **MongoDB** through PyMongo's asyncio API (`AsyncClientSession.with_transaction`,
  relay.inbox.async_store): the transaction, the records, the handler awaited inside it.
- **Kafka** through the sync inbox's own consumer (relay.inbox.consumer.KafkaSource) owned by one
  thread: every call on the consumer (building it, subscribing, `consume` with its rebalance
  callbacks, `commit`, `close`), the dead-letter producer and decoding (which may ask a Schema
  Registry over HTTP) run on a single-thread executor, awaited from the loop. One thread keeps
  librdkafka's rebalance callbacks on the thread that polls, as in the sync inbox, so a
  rebalance still happens only while a batch is being gathered, never while one is applied.
  `confluent_kafka.aio.AIOConsumer` was not used: it is young (its rebalance callbacks re-enter
  the consumer and can deadlock with its default two workers) and its producer takes no headers,
  which the dead letters need.

Ending: `stop()` (any thread, a signal handler installed with `loop.add_signal_handler`, the loop)
makes `run` return after the batch in hand, as the sync inbox; the async inbox installs no signal
handler itself (the service owns its loop's signals). Cancelling the task running `run` ends it
where it awaits: a MongoDB transaction in progress is aborted (with_transaction aborts on
CancelledError), the batch's offsets stay uncommitted (the next consumer reads it again and skips
what a committed transaction recorded); then everything `run` opened is closed, the consumer and
the producer on their thread, and CancelledError propagates (never swallowed). The close of the
consumer is queued on its thread, so it happens even when the cleanup is cancelled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection

from relay.avro.folder import SchemaFolder
from relay.inbox.async_store import AsyncHandler, AsyncInboxStore
from relay.inbox.config import RunOptions
from relay.inbox.decoding import EventDecoder
from relay.inbox.inbox import InboxBase, is_async_callable
from relay.inbox.metrics import InboxMetrics
from relay.inbox.records import DEFAULT_RETENTION
from relay.inbox.sources import DeadLetters, MessageSource, open_dead_letters, open_source
from relay.inbox.steps import Action, Apply, BatchSteps, Commit, SendDeadLetter, decode_all, drive_async
from relay.inbox.stopping import StopRequested, StopSignal
from relay.outbox.writer import require_async_collection

log = logging.getLogger("relay.inbox")
P = ParamSpec("P")
T = TypeVar("T")


class KafkaThread:
    """The one thread every Kafka call of a run is made on, awaited from the event loop."""

    def __init__(self, group_id: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"relay-inbox-kafka-{group_id}")

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on the Kafka thread. Cancelling the await does not stop the call:
        it finishes on its thread (a consumer call cannot be interrupted)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def shutdown(self) -> None:
        """No more calls; the ones queued (a consumer's close) still run, on the thread."""
        self._executor.shutdown(wait=False)


@dataclass(frozen=True)
class AsyncInboxParts:
    """The boundaries one `AsyncInbox.run` call uses (fakes in tests/unit/test_inbox_steps.py)."""

    source: MessageSource
    decoder: EventDecoder
    store: AsyncInboxStore
    dead_letters: DeadLetters | None
    kafka: KafkaThread


class AsyncSteps(BatchSteps):
    """One `run` call's steps over its parts, each action awaited (Kafka on its thread)."""

    def __init__(
        self,
        metrics: InboxMetrics,
        stop: StopSignal,
        options: RunOptions,
        parts: AsyncInboxParts,
        handler: AsyncHandler,
    ) -> None:
        super().__init__(metrics, stop, options)
        self.handler = handler
        self.source, self.decoder, self.store = parts.source, parts.decoder, parts.store
        self.dead_letters, self.kafka = parts.dead_letters, parts.kafka

    async def step(self, session: AsyncClientSession) -> None:
        """One batch: gathered, decoded, applied up to each poison message, committed."""
        batch = await self.kafka.call(self.source.gather, self.limits, self.stop)
        try:
            items = await self.retry.call_async(lambda: self.kafka.call(decode_all, self.decoder, batch))
            await drive_async(self.steps(batch, items), lambda action: self._do(session, action))
        except StopRequested as stopped:
            self.abandoned(batch, stopped)
        self.after_step(await self.kafka.call(self.source.lags))

    async def _do(self, session: AsyncClientSession, action: Action) -> Any:
        if isinstance(action, Apply):
            return await self.retry.call_async(lambda: self.store.apply(session, action.events, self.handler))
        if isinstance(action, Commit):
            return await self.kafka.call(self.source.commit, action.offsets)
        if isinstance(action, SendDeadLetter):
            assert self.dead_letters is not None  # only yielded under the dead-letter policy
            return await self.kafka.call(self.dead_letters.send, action.poisoned, action.message)
        return await self.retry.call_async(
            lambda: self.store.record_dead_letter(session, action.event_id, action.where, action.event)
        )


class AsyncInbox(InboxBase):
    """`Inbox` for asyncio services: exactly-once effects for a consumer whose state is in
    MongoDB, over PyMongo's AsyncCollection (a synchronous Collection raises TypeError).

    The same options (`retention`, `registry`, `schema_folder`), records, metrics and rules as
    `Inbox`: a sync and an async consumer of one group can run side by side (a service migrating
    from one to the other). The module docstring says how Kafka is read and how it ends.
    """

    def __init__(
        self,
        collection: AsyncCollection[Any],
        *,
        retention: dt.timedelta | float = DEFAULT_RETENTION,
        registry: CollectorRegistry | None = None,
        schema_folder: SchemaFolder | None = None,
    ) -> None:
        require_async_collection(collection, "AsyncInbox", "relay.inbox.Inbox")
        super().__init__(collection, retention=retention, registry=registry, schema_folder=schema_folder)

    async def run(
        self,
        handler: AsyncHandler,
        *,
        topics: Sequence[str] | str,
        group_id: str,
        bootstrap_servers: str | None = None,
        **options: Any,
    ) -> None:
        """Consume `topics` as `group_id`, awaiting `handler(event, session)` inside a MongoDB
        transaction once per event, ever; returns after `stop()`. Raises InboxPoisonError at a
        poison event under `on_poison="stop"`, ConfigError for a bad option (the sync inbox's),
        any error that is neither poison nor retryable, TypeError for a handler that is not an
        `async def` (or an object with an async `__call__`); CancelledError when its task is
        cancelled, after closing what it opened."""
        if not is_async_callable(handler):
            raise TypeError(
                "AsyncInbox.run awaits handler(event, session): pass an async def function "
                "(a plain function's writes would block the event loop; relay.inbox.Inbox runs those)"
            )
        opts = RunOptions.of(topics, group_id, bootstrap_servers, options)
        self._stop.attach(asyncio.get_running_loop())
        try:
            async with contextlib.AsyncExitStack() as resources:
                steps = await self._open(opts, handler, resources)
                session = await _started(self.collection.database.client.start_session())
                resources.push_async_callback(session.end_session)
                # First thing on the way out (a cancelled run): a gather in progress on the Kafka
                # thread returns at its next poll, so the consumer's close queued after it runs soon.
                resources.callback(self._stop.set)
                log.info("inbox consuming %s as group %s", ",".join(opts.topics), group_id, extra={"group": group_id})
                while not self._stop.is_set():
                    await steps.step(session)
        finally:
            self._stop.detach()
            self._stop.clear()  # this run has ended: the next one starts afresh
        log.info("inbox stopped", extra={"group": group_id})

    async def _open(self, opts: RunOptions, handler: AsyncHandler, resources: contextlib.AsyncExitStack) -> AsyncSteps:
        """The run's parts; each one opened is closed by `resources` (in reverse order) however
        the run ends, also when opening the next one fails or the task is cancelled."""
        kafka = KafkaThread(opts.group_id)
        resources.callback(kafka.shutdown)
        store = AsyncInboxStore(self.collection, opts.group_id, self.retention)
        await store.ensure_indexes()
        decoder = self._decoder(opts)
        dead_letters = None
        if opts.on_poison == "dead-letter":
            dead_letters = await kafka.call(open_dead_letters, opts)
            resources.push_async_callback(kafka.call, dead_letters.close)
        source = await kafka.call(open_source, opts)
        resources.push_async_callback(kafka.call, source.close)
        steps = AsyncSteps(
            InboxMetrics(self.registry, opts.group_id),
            self._stop,
            opts,
            AsyncInboxParts(source, decoder, store, dead_letters, kafka),
            handler,
        )
        resources.callback(steps.close)
        return steps


async def _started(session: AsyncClientSession | Awaitable[AsyncClientSession]) -> AsyncClientSession:
    """`AsyncMongoClient.start_session()`'s session: a coroutine in some pymongo releases."""
    return await session if inspect.isawaitable(session) else session

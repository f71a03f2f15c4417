"""Helpers for the inbox's server tests: a downstream service's handler, the inbox on a thread or
in a child process, and the oracle: effects compared with the outbox.

The handler of every scenario appends the event's per-aggregate sequence number (`seq`, written
by tests.support.writes.write_events in commit order, starting at 1) to the aggregate's effect
document, in the inbox's transaction. Exactly-once effects in the relay's order then mean: for every aggregate,
the effect document's `seqs` is exactly 1, 2, ..., n, n being how many events the outbox holds for
it. One comparison catches a lost event, an event applied twice and a reordering.

Both forms of the inbox run here: `Inbox` (InboxThread, `effects_handler`) and `AsyncInbox`
(AsyncInboxThread: an event loop on a thread of its own, an AsyncMongoClient, `async_effects_handler`).
`consumer(form, env, ...)` builds either, with the effects handler, for tests parametrized by form.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.client_session import ClientSession

from relay.inbox import AsyncInbox, Inbox, InboxEvent
from tests.support.paths import ROOT
from tests.support.relays import ChildProcess
from tests.support.waiting import wait_until
from tests.support.writes import Written

EFFECTS = "effects"
INBOX = "inbox"


def effects_handler(db: Any, fail_on: Callable[[InboxEvent], bool] | None = None) -> Callable[[InboxEvent, ClientSession], None]:
    """The downstream service: one `update_one` per event, in the inbox's session."""
    def handle(event: InboxEvent, session: ClientSession) -> None:
        if fail_on is not None and fail_on(event):
            raise ValueError(f"refusing {event.event_id}")
        db[EFFECTS].update_one({"_id": event.aggregate_id}, {"$push": {"seqs": event.payload["seq"]}},
                               upsert=True, session=session)
    return handle


def async_effects_handler(db: Any, fail_on: Callable[[InboxEvent], bool] | None = None
                          ) -> Callable[[InboxEvent, AsyncClientSession], Awaitable[None]]:
    """The same downstream service for the async inbox (`db` an AsyncDatabase), awaited in its session."""
    async def handle(event: InboxEvent, session: AsyncClientSession) -> None:
        if fail_on is not None and fail_on(event):
            raise ValueError(f"refusing {event.event_id}")
        await db[EFFECTS].update_one({"_id": event.aggregate_id}, {"$push": {"seqs": event.payload["seq"]}},
                                     upsert=True, session=session)
    return handle


def effects(db: Any) -> dict[str, list[int]]:
    return {doc["_id"]: doc["seqs"] for doc in db[EFFECTS].find()}


def applied_count(db: Any) -> int:
    return sum(len(s) for s in effects(db).values())


def assert_effects_exactly_once_in_order(db: Any, written: Written, except_ids: set[str] = frozenset()) -> None:
    """Every outbox event applied once, per aggregate in commit order (`except_ids`: poison events)."""
    got = effects(db)
    bad = []
    for agg, ids in written.per_aggregate.items():
        want = [i + 1 for i, eid in enumerate(ids) if eid not in except_ids]
        if got.get(agg, []) != want:
            bad.append(f"{agg}: applied {got.get(agg, [])[:20]} want {want[:20]}")
    assert not bad, f"{len(bad)} aggregates wrong, e.g. {bad[:3]}"
    assert set(got) <= set(written.per_aggregate), "effects for aggregates never written"


def recorded_not_committed(db: Any, bootstrap: str, topic: str, group: str) -> int:
    """How many inbox records of `group` are at or past the group's committed offset of their
    partition: events whose MongoDB transaction committed but whose Kafka offset commit did not
    happen (yet). Read while no consumer of the group runs, it counts what a kill left in the window
    between the two commits, for the next consumer to read again and skip."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": "false"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
    finally:
        consumer.close()
    return sum(db[INBOX].count_documents({"group": group, "topic": topic, "partition": tp.partition,
                                          "offset": {"$gte": max(tp.offset, 0)}}) for tp in committed)


def wait_applied(db: Any, count: int, timeout: float = 90, alive: Callable[[], None] | None = None) -> None:
    wait_until(lambda: applied_count(db) >= count, timeout, f"{count} events applied", interval=0.3, alive=alive)


class _ConsumerThread:
    """An inbox run on a thread: started and stopped (`inbox.stop()`) by `with`; its error."""

    inbox: Any
    run_kwargs: dict[str, Any]
    thread: threading.Thread
    error: BaseException | None = None

    def check_alive(self) -> None:
        if not self.thread.is_alive():
            raise RuntimeError(f"the inbox stopped: {self.error!r}") from self.error

    def metric(self, name: str, **labels: str) -> float:
        """A sample of this inbox's series (its group's label added)."""
        return self.inbox.registry.get_sample_value(name, {"group": self.run_kwargs["group_id"], **labels}) or 0.0

    def lags(self) -> dict[int, float]:
        """partition -> relay_inbox_lag_messages, for the partitions this inbox reports."""
        return {int(s.labels["partition"]): s.value for family in self.inbox.registry.collect()
                if family.name == "relay_inbox_lag_messages" for s in family.samples
                if s.labels["group"] == self.run_kwargs["group_id"]}

    def __enter__(self) -> Any:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inbox.stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the inbox did not stop"


class InboxThread(_ConsumerThread):
    """`Inbox.run` on a thread (stopped with `Inbox.stop`); its error, if it raised."""

    def __init__(self, db: Any, handler: Callable[..., None], retention: Any = None, **run: Any) -> None:
        self.inbox = Inbox(db[INBOX]) if retention is None else Inbox(db[INBOX], retention=retention)
        self.run_kwargs = run
        self.thread = threading.Thread(target=self._run, args=(handler,), daemon=True)

    def _run(self, handler: Callable[..., None]) -> None:
        try:
            self.inbox.run(handler, **self.run_kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc


class AsyncInboxThread(_ConsumerThread):
    """`AsyncInbox.run` in an event loop on a thread of its own, over an AsyncMongoClient of its
    own (stopped with `AsyncInbox.stop`, from the test's thread); its error, if it raised.
    `handler(db)` gives the async handler for the AsyncDatabase `database`."""

    def __init__(self, uri: str, database: str, handler: Callable[[Any], Callable[..., Awaitable[None]]],
                 retention: Any = None, **run: Any) -> None:
        self.client: AsyncMongoClient[Any] = AsyncMongoClient(uri, tz_aware=True)
        db = self.client[database]
        options = {} if retention is None else {"retention": retention}
        self.inbox = AsyncInbox(db[INBOX], **options)
        self.handler = handler(db)
        self.run_kwargs = run
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            try:
                await self.inbox.run(self.handler, **self.run_kwargs)
            finally:
                await self.client.close()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc


FORMS = ("sync", "async")


def consumer(form: str, env: Any, fail_on: Callable[[InboxEvent], bool] | None = None, **run: Any) -> Any:
    """An inbox of `form` ("sync" or "async") on a thread, applying the effects to `env`'s database."""
    if form == "sync":
        return InboxThread(env.db, effects_handler(env.db, fail_on), **run)
    return AsyncInboxThread(env.settings.mongodb_uri, env.settings.database,
                            lambda db: async_effects_handler(db, fail_on), **run)


class InboxProcess(ChildProcess):
    """tests/inbox_service.py as a child process (SIGKILLed by the kill test; stopped by pid);
    `form` "async" runs the AsyncInbox in it."""

    def __init__(self, log_path: Path, mongodb_uri: str, database: str, topic: str, group: str, bootstrap: str,
                 commit_delay_s: float = 0.0, form: str = "sync", nats_stream: str = "",
                 rabbitmq_exchange: str = "") -> None:
        self.args = [mongodb_uri, database, topic, group, bootstrap, form]
        self.log_path = log_path
        self.commit_delay_s = commit_delay_s
        self.nats_stream = nats_stream  # with a nats:// `bootstrap`: the stream it reads
        self.rabbitmq_exchange = rabbitmq_exchange  # with an amqp:// `bootstrap`: the relay's exchange

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "tests.inbox_service", *self.args]

    def environ(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if self.commit_delay_s:
            env["INBOX_TEST_COMMIT_DELAY_S"] = str(self.commit_delay_s)
        if self.nats_stream:
            env["INBOX_TEST_NATS_STREAM"] = self.nats_stream
        if self.rabbitmq_exchange:
            env["INBOX_TEST_RABBITMQ_EXCHANGE"] = self.rabbitmq_exchange
        return env


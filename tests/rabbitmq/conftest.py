"""The RabbitMQ tests' servers: a rabbitmq-server per worker (beside the worker's MongoDB), and each
test's settings publishing to an exchange of its own (RELAY_BROKER=rabbitmq), with a quorum queue
bound to it with `outbox.#` as an operator would make before the relay starts."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo
import pytest

from relay.config import Settings
from relay.dev.rabbitmq_server import RabbitServer
from tests.support.mongodb import transaction_lifetime
from tests.support.rabbitmq import QueueReader, bind_queue


def started(folder_prefix: str) -> RabbitServer:
    server = RabbitServer(Path(tempfile.mkdtemp(prefix=folder_prefix)))
    server.start()
    return server


def stopped(server: RabbitServer) -> None:
    server.stop()
    shutil.rmtree(server.base_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitServer]:
    server = started("outbox-relay-rabbitmq-")
    try:
        yield server
    finally:
        stopped(server)


@dataclass
class RabbitEnv:
    """One test's world on RabbitMQ: its own database, exchange and queue."""

    server: RabbitServer
    settings: Settings
    client: pymongo.MongoClient[Any]
    tag: str

    @property
    def db(self) -> Any:
        return self.client[self.settings.database]

    @property
    def exchange(self) -> str:
        return self.settings.rabbitmq_exchange

    @property
    def queue(self) -> str:
        return f"q{self.tag}"

    def bind(self, *bindings: str, single_active: bool = False) -> QueueReader:
        """The test's quorum queue bound to its exchange (`outbox.#` when none given), and its reader
        (`single_active`: the queue has x-single-active-consumer, as for an inbox)."""
        bind_queue(self.server.url, self.queue, self.exchange, bindings or ("outbox.#",), single_active)
        return QueueReader(self.server.url, self.queue)


def rabbit_settings(servers: Any, server: RabbitServer, tag: str) -> Settings:
    return Settings().replace(
        broker="rabbitmq", rabbitmq_url=server.url, rabbitmq_exchange=f"x{tag}",
        mongodb_uri=servers.mongodb_uri, database=f"t_{tag}",
        http_port=0, instance_id=f"test-{tag}", lease_ttl_s=4.0, heartbeat_interval_s=1.0, standby_poll_s=0.3,
        max_await_ms=200, connect_timeout_s=15.0, restart_backoff_max_s=2.0,
    )  # fmt: skip


def rabbit_env(servers: Any, server: RabbitServer) -> Iterator[RabbitEnv]:
    tag = uuid.uuid4().hex[:8]
    settings = rabbit_settings(servers, server, tag)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(servers.mongodb_uri, tz_aware=True)
    client[settings.database].create_collection(settings.outbox_collection)
    try:
        yield RabbitEnv(server, settings, client, tag)
    finally:
        client.drop_database(settings.database)
        client.close()


@pytest.fixture
def renv(servers: Any, rabbitmq_server: RabbitServer) -> Iterator[RabbitEnv]:
    yield from rabbit_env(servers, rabbitmq_server)


@pytest.fixture
def own_renv(servers: Any) -> Iterator[RabbitEnv]:
    """A test's world on a rabbitmq-server of its own (the test kills it)."""
    server = started("outbox-relay-rabbitmq-own-")
    try:
        yield from rabbit_env(servers, server)
    finally:
        stopped(server)


@pytest.fixture
def short_transaction_lifetime(renv: RabbitEnv) -> Iterator[None]:
    """A killed consumer's open transaction keeps its write locks until the server aborts it
    (transactionLifetimeLimitSeconds, 60 s by default): 5 s here, as tests/faults/test_inbox_faults.py."""
    with transaction_lifetime(renv.client, 5):
        yield

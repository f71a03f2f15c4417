"""The NATS tests' servers: a nats-server with JetStream per worker (beside the worker's MongoDB),
and each test's settings publishing to a stream of its own (RELAY_BROKER=nats)."""

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
from relay.dev.nats_server import NatsServer
from tests.support.mongodb import transaction_lifetime
from tests.support.nats import read_stream, stream_size


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    server = NatsServer(Path(tempfile.mkdtemp(prefix="outbox-relay-nats-")))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.base_dir, ignore_errors=True)


@dataclass
class NatsEnv:
    """One test's world on NATS: its own database, stream and subjects."""

    server: NatsServer
    settings: Settings
    client: pymongo.MongoClient[Any]
    tag: str

    @property
    def db(self) -> Any:
        return self.client[self.settings.database]

    @property
    def stream(self) -> str:
        return self.settings.nats_stream

    def subject(self, aggregate_type: str = "order") -> str:
        return self.settings.topic_template.format(aggregateType=aggregate_type, eventType="")

    def read(self, subject: str = ">") -> list[Any]:
        return read_stream(self.server.url, self.stream, subject)

    def size(self) -> int:
        return stream_size(self.server.url, self.stream)


@pytest.fixture
def nenv(servers: Any, nats_server: NatsServer) -> Iterator[NatsEnv]:
    tag = uuid.uuid4().hex[:8]
    settings = Settings().replace(
        broker="nats", nats_servers=nats_server.url, nats_stream=f"S{tag}",
        mongodb_uri=servers.mongodb_uri, database=f"t_{tag}", topic_template=f"t{tag}.event.{{aggregateType}}",
        http_port=0, instance_id=f"test-{tag}", lease_ttl_s=4.0, heartbeat_interval_s=1.0, standby_poll_s=0.3,
        max_await_ms=200, connect_timeout_s=15.0, restart_backoff_max_s=2.0,
    )
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(servers.mongodb_uri, tz_aware=True)
    client[settings.database].create_collection(settings.outbox_collection)
    try:
        yield NatsEnv(nats_server, settings, client, tag)
    finally:
        client.drop_database(settings.database)
        client.close()


@pytest.fixture
def short_transaction_lifetime(nenv):
    """A killed consumer's open transaction keeps its write locks until the server aborts it
    (transactionLifetimeLimitSeconds, 60 s by default): 5 s here, as tests/faults/test_inbox_faults.py."""
    with transaction_lifetime(nenv.client, 5):
        yield

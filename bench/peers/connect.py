"""Kafka Connect standalone workers running the two peer connectors, from cached Maven jars.

What runs (one worker JVM per connector, one connector with one task per worker):
- the worker: `org.apache.kafka.connect.cli.ConnectStandalone` from `connect-runtime`
  KAFKA_CONNECT_VERSION (the version of the benchmark's broker), started with the JVM options
  of Kafka's `connect-standalone.sh` (-Xms256M -Xmx2G, G1, MaxGCPauseMillis=20), the worker's
  default producer settings (acks=all, max.in.flight.requests.per.connection=1, no compression,
  linger.ms=5), offsets in a fresh temporary file, REST on a free loopback port (used only
  to read the connector's status), logs at INFO to a file;
- its `plugin.path` holds exactly one plugin folder (the connector and its own MongoDB driver,
  loaded in isolation by Connect's plugin class loader).

The connectors read the outbox through a change stream that starts at a given cluster time
(the benchmark gives the time just before the backlog's first insert, the same start the relay
gets), so all three read the same oplog entries the same way; none does a collection scan.

Jars come from Maven Central through `bench/peers/pom.xml` (`mvn dependency:copy-dependencies`,
once, into `~/.cache/outbox-relay/bench-peers-<versions>/`); later runs never download.
Processes are started in their own session and stopped by their process id (SIGTERM, then
SIGKILL after 30 s), never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bson import Timestamp

from bench.peers.process import PeerError, PeerProcess
from relay.dev.maven import MavenError, copy_dependencies, is_resolved
from relay.dev.stack import KAFKA_VERSION, ManagedProcess, cache_dir, free_port

KAFKA_CONNECT_VERSION = KAFKA_VERSION     # the Connect worker runs the broker's own version
DEBEZIUM_VERSION = "3.5.0.Final"          # newest Debezium built against Kafka 4.1.1
MONGO_KAFKA_VERSION = "2.0.1"             # newest org.mongodb.kafka:mongo-kafka-connect
LOG4J_VERSION = "2.24.3"                  # the log4j2 of the Kafka 4.1.1 distribution
PROFILES = ("runtime", "debezium", "mongo")   # pom.xml profiles, one cache folder each
POM = Path(__file__).resolve().parent / "pom.xml"

# Kafka's connect-standalone.sh / kafka-run-class.sh defaults.
CONNECT_JVM_OPTIONS = [
    "-Xms256M", "-Xmx2G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true",
]

JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
STRING_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %d{UNIX_MILLIS} %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
"""


# ---- jars -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeerJars:
    """Where the resolved jars are: `<base>/<profile>/lib/*.jar` for each pom profile."""

    base: Path

    def lib(self, profile: str) -> Path:
        return self.base / profile / "lib"

    @property
    def classpath(self) -> str:
        """The worker's classpath (Connect runtime, JsonConverter, log4j2)."""
        return str(self.lib("runtime") / "*")

    def plugin_path(self, plugin: str) -> Path:
        """A `plugin.path` entry holding just this plugin's folder (`<base>/<plugin>/lib`)."""
        return self.base / plugin


def peers_cache_dir() -> Path:
    return cache_dir() / (f"bench-peers-connect-{KAFKA_CONNECT_VERSION}-debezium-{DEBEZIUM_VERSION}"
                          f"-mongo-kafka-{MONGO_KAFKA_VERSION}")


def fetch_jars(fetch: bool = True) -> PeerJars:
    """The peers' jars, resolving each missing profile once with Maven (`copy-dependencies`).

    A profile's `lib` folder is complete once it holds `.complete` (`relay.dev.maven`); a failed
    resolution leaves nothing behind. With `fetch=False` a missing folder raises instead of running Maven.
    """
    jars = PeerJars(peers_cache_dir())
    versions = {"kafka.version": KAFKA_CONNECT_VERSION, "debezium.version": DEBEZIUM_VERSION,
                "mongo.kafka.version": MONGO_KAFKA_VERSION, "log4j.version": LOG4J_VERSION}
    for profile in PROFILES:
        lib = jars.lib(profile)
        if is_resolved(lib):
            continue
        if not fetch:
            raise PeerError(f"peer jars not in {lib}: run `python -m bench.peers fetch`")
        try:
            copy_dependencies(POM, lib, versions, profile=profile)
        except MavenError as exc:
            raise PeerError(f"Maven could not resolve the '{profile}' jars of {POM}:\n{exc}") from None
    return jars


# ---- connectors -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConnectorSpec:
    """One connector: its configuration, the plugin folder it needs, and where it writes."""

    key: str                 # short id ("debezium", "mongo"): file names, JSON keys
    label: str               # row name in the benchmark's table
    plugin: str              # the pom profile / cache folder holding its jars
    topic: str               # every message of the benchmark's outbox ends up here
    config: dict[str, str]   # connector properties (name, class, converters, ...)
    output: str              # what a message is, in words, for the table
    worker: dict[str, str] = field(default_factory=dict)  # extra worker properties (producer.*)

    @property
    def name(self) -> str:
        return self.config["name"]


def debezium_outbox_connector(mongo_uri: str, database: str, collection: str, start: Timestamp,
                              topic_prefix: str, aggregate_type: str) -> ConnectorSpec:
    """Debezium's MongoDB connector + MongoEventRouter, configured for our outbox fields.

    - no snapshot (`snapshot.mode=no_data`); the change stream starts at `start`
      (`capture.start.op.time`, a BSON timestamp as one 64-bit number: seconds << 32 | increment);
    - router: event id `_id`, key `aggregateId`, payload `payload` expanded to a JSON object,
      `eventType` into a header (the id goes to header `id`), topic = `<prefix>.<aggregateType>`;
    - JsonConverter, schemas disabled, for key and value.
    Everything else is Debezium's default (batches of 2048, queue of 8192, poll every 500 ms).
    """
    route = "transforms.outbox."
    config = {
        "name": "bench-debezium-outbox",
        "connector.class": "io.debezium.connector.mongodb.MongoDbConnector",
        "tasks.max": "1",
        "mongodb.connection.string": mongo_uri,
        "topic.prefix": f"{topic_prefix}.raw",
        "database.include.list": database,
        "collection.include.list": f"{database}.{collection}",
        "snapshot.mode": "no_data",
        "capture.start.op.time": str((start.time << 32) | start.inc),
        "transforms": "outbox",
        route + "type": "io.debezium.connector.mongodb.transforms.outbox.MongoEventRouter",
        route + "collection.field.event.id": "_id",
        route + "collection.field.event.key": "aggregateId",
        route + "collection.field.event.type": "eventType",
        route + "collection.field.event.payload": "payload",
        route + "collection.expand.json.payload": "true",
        route + "collection.fields.additional.placement": "eventType:header:eventType",
        route + "route.by.field": "aggregateType",
        route + "route.topic.replacement": f"{topic_prefix}.${{routedByValue}}",
        "key.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": "false",
        "value.converter": JSON_CONVERTER,
        "value.converter.schemas.enable": "false",
    }
    return ConnectorSpec("debezium", "peer: Debezium MongoDB + outbox router", "debezium",
                         f"{topic_prefix}.{aggregate_type}", config,
                         "JSON (JsonConverter, no schema): payload object; headers id, eventType + 4 __debezium.context.*; key aggregateId")


def mongodb_source_connector(mongo_uri: str, database: str, collection: str, start: Timestamp,
                             topic_prefix: str) -> ConnectorSpec:
    """The official MongoDB Kafka source connector, publishing each inserted outbox document.

    - `startup.mode=timestamp` at `start` (`{"$timestamp": {"t": .., "i": ..}}`), no copy;
    - `publish.full.document.only=true`: the value is the whole outbox document as JSON
      (the connector's default JSON formatter, extended JSON for ObjectId and dates), the key
      `{"_id": ...}` of the document, no headers;
    - StringConverter for key and value (the connector already produced JSON strings);
    - topic `<prefix>.<database>.<collection>` (its default topic mapper).
    Everything else is the connector's default (poll.max.batch.size 1000, poll.await.time.ms 5000).
    """
    config = {
        "name": "bench-mongodb-source",
        "connector.class": "com.mongodb.kafka.connect.MongoSourceConnector",
        "tasks.max": "1",
        "connection.uri": mongo_uri,
        "database": database,
        "collection": collection,
        "startup.mode": "timestamp",
        "startup.mode.timestamp.start.at.operation.time":
            json.dumps({"$timestamp": {"t": start.time, "i": start.inc}}),
        "publish.full.document.only": "true",
        "topic.prefix": topic_prefix,
        "key.converter": STRING_CONVERTER,
        "value.converter": STRING_CONVERTER,
    }
    return ConnectorSpec("mongo", "peer: MongoDB Kafka source connector", "mongo",
                         f"{topic_prefix}.{database}.{collection}", config,
                         "JSON (StringConverter): whole outbox document (extended JSON); no headers; key {_id}")


# The throughput settings each peer's own documentation recommends (BENCHMARKS.md names them):
# - Kafka Connect's producer, for every source connector (worker properties with the `producer.`
#   prefix): larger batches, a linger, lz4 compression - Confluent, "How to Tune Kafka Connect
#   Source Connectors to Optimize Throughput" (confluent.io/blog/how-to-increase-throughput-on-
#   kafka-connect-source-connectors);
# - the MongoDB source connector: `poll.max.batch.size` (records per poll, default 1000) and
#   `batch.size` (the change stream cursor's batch, default 0 = server default) - MongoDB Kafka
#   Connector docs, source connector configuration properties (change stream, Kafka topic);
# - Debezium's MongoDB connector: `max.batch.size` (default 2048) and `max.queue.size` (default
#   8192, must exceed the batch), `poll.interval.ms` - Debezium MongoDB connector docs,
#   "Advanced connector configuration properties".
TUNED_PRODUCER = {"producer.linger.ms": "100", "producer.batch.size": "262144", "producer.compression.type": "lz4"}
TUNED_CONNECTOR = {
    "mongo": {"poll.max.batch.size": "10000", "batch.size": "10000", "poll.await.time.ms": "100"},
    "debezium": {"max.batch.size": "10000", "max.queue.size": "40000", "poll.interval.ms": "100"},
}


def tuned(spec: ConnectorSpec) -> ConnectorSpec:
    """The same connector with its documented throughput settings (TUNED_*), writing to a topic
    of its own."""
    topic = f"{spec.topic}.tuned"
    config = {**spec.config, **TUNED_CONNECTOR[spec.key], "name": f"{spec.config['name']}-tuned"}
    if spec.key == "mongo":
        config["topic.prefix"] = f"{config['topic.prefix']}.tuned"
        topic = f"{config['topic.prefix']}.{config['database']}.{config['collection']}"
    else:  # the outbox router's topic replacement
        route = "transforms.outbox.route.topic.replacement"
        config[route] = config[route].replace("${routedByValue}", "tuned.${routedByValue}")
        topic = spec.topic.rsplit(".", 1)[0] + ".tuned." + spec.topic.rsplit(".", 1)[1]
    return ConnectorSpec(f"{spec.key}-tuned", f"{spec.label} (tuned)", spec.plugin, topic, config, spec.output,
                         dict(TUNED_PRODUCER))


# ---- the worker -----------------------------------------------------------------------------------

def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java:
        raise PeerError("Java 17+ is needed to run Kafka Connect; install a JDK")
    return java


def _properties(values: dict[str, str]) -> str:
    """A Java .properties text (backslashes and line breaks escaped; keys are plain)."""
    def escape(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "".join(f"{k}={escape(v)}\n" for k, v in values.items())


@dataclass
class StandaloneWorker(PeerProcess):
    """One `ConnectStandalone` JVM running one connector; use as a context manager.

    `start()` returns once the JVM process exists (not once it is ready: the benchmark times
    start-up too). `check_alive()` raises `PeerError` if the JVM exited or the connector or its
    task is FAILED. `stop()` stops the JVM by its pid, copies its log to `keep_log` (if given)
    and deletes the temporary folder. (Its CPU and RSS are sampled by `bench.sampling` on `pid`.)
    """

    jars: PeerJars
    spec: ConnectorSpec
    bootstrap_servers: str
    keep_log: Path | None = None
    LOG_NAME = "connect.log"
    work_dir: Path = field(init=False)
    rest_port: int = field(init=False, default=0)
    process: ManagedProcess | None = field(init=False, default=None)
    _last_status_check: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"outbox-relay-bench-{self.spec.key}-"))

    def start(self) -> None:
        self.rest_port = free_port()
        worker = {
            "bootstrap.servers": self.bootstrap_servers,
            "key.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": "false",
            "value.converter": JSON_CONVERTER,
            "value.converter.schemas.enable": "false",
            "offset.storage.file.filename": str(self.work_dir / "connect.offsets"),
            "plugin.path": str(self.jars.plugin_path(self.spec.plugin)),
            "listeners": f"http://127.0.0.1:{self.rest_port}",
            **self.spec.worker,
        }
        (self.work_dir / "worker.properties").write_text(_properties(worker))
        (self.work_dir / "connector.properties").write_text(_properties(self.spec.config))
        (self.work_dir / "log4j2.properties").write_text(_LOG4J2)
        argv = [java_binary(), *CONNECT_JVM_OPTIONS,
                f"-Dlog4j2.configurationFile=file:{self.work_dir / 'log4j2.properties'}",
                "-cp", self.jars.classpath, "org.apache.kafka.connect.cli.ConnectStandalone",
                str(self.work_dir / "worker.properties"), str(self.work_dir / "connector.properties")]
        self.process = ManagedProcess(f"connect-{self.spec.key}", argv, self.log_path)
        self.process.start()

    def status(self) -> dict[str, Any] | None:
        """The connector's status from the worker's REST API, or None while it is not up."""
        url = f"http://127.0.0.1:{self.rest_port}/connectors/{self.spec.name}/status"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        try:
            with opener.open(url, timeout=2) as response:
                return json.loads(response.read())  # type: ignore[no-any-return]
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def check_alive(self) -> None:
        """Raise PeerError if the JVM exited or (checked at most once a second) anything FAILED."""
        if self.process is None or not self.process.alive:
            raise PeerError(f"the Connect worker for {self.spec.label} exited; "
                            f"log {self.log_path}:\n{self.log_tail()}")
        now = time.monotonic()
        if now - self._last_status_check < 1.0:
            return
        self._last_status_check = now
        status = self.status()
        if status is None:
            return
        states = [("connector", status.get("connector", {}))] + \
                 [(f"task {t.get('id')}", t) for t in status.get("tasks", [])]
        for what, s in states:
            if s.get("state") == "FAILED":
                raise PeerError(f"{self.spec.label}: {what} FAILED:\n{str(s.get('trace', ''))[:3000]}")

    def connector_started_at(self) -> float | None:
        """When the worker began to create the connector (Unix seconds, from its log), if it did.

        The line is Connect's `Worker.startConnector` "Creating connector <name> of type ...";
        each log line carries `%d{UNIX_MILLIS}` after the readable date.
        """
        marker = f" Creating connector {self.spec.name} "
        try:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    if marker in line:
                        return int(line.split("] ", 1)[1].split(" ", 1)[0]) / 1000.0
        except (OSError, IndexError, ValueError):
            pass
        return None

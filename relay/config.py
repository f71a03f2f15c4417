"""Settings: one frozen object, every setting declared once with its type, default and meaning.

Sources, later ones win: defaults < TOML file (`--config` / `RELAY_CONFIG_FILE`) < environment
(`RELAY_<FIELD>`, `RELAY_KAFKA_<PROPERTY>`) < command-line flags. `Settings.load()` validates once:
`parts()` builds each part's small configuration by keyword (mypy checks every one), and each
checks its own values; a problem raises `ConfigError` naming the setting. Only the wiring and the
commands read Settings. The README's configuration table is generated from `SETTINGS_DOC`.

Judged against pydantic-settings: it would parse the three sources with types too, but not keep
every message and variable name as they are, and it would put pydantic into the light client's
installation; the parsing here is some sixty lines (`load`, `_parse`, `_read_toml`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import os
import socket
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient

from relay.avro.config import EncodingConfig, RegistryConfig
from relay.core.config import EXACTLY_ONCE, LeaseTiming, LoopConfig
from relay.core.errors import ConfigError
from relay.core.names import ENV_PREFIX, KAFKA_ENV_PREFIX, env_name, kafka_env_name
from relay.core.partitions import Scope, scopes
from relay.core.redact import (
    Properties,
    Secret,
    Uri,
    credential_values,
    redact_mapping,
    register_secrets,
    uri_secrets,
)
from relay.group.config import GroupConfig
from relay.kafka.config import KafkaConfig
from relay.mongo.config import MongoConfig, OutboxCleanupConfig, uri_credentials
from relay.mongo.lease import LeaseStore
from relay.mongo.lease_admin import LeaseDocument
from relay.ops.config import HealthConfig, ObserverConfig, check_logging
from relay.outbox import FieldNames

__all__ = [
    "SETTINGS_DOC",
    "PartConfigs",
    "Settings",
    "env_name",
    "flag_name",
    "kafka_env_name",
    "load_settings",
    "markdown_table",
    "parse_pairs",
    "settings_parser",
]

# RELAY_ variables that are not settings: the file to read settings from, and where the project
# caches what it downloads (relay.cachedir; the pipeline image sets it). RELAY_DEV_*, RELAY_TEST_*
# and RELAY_BENCH_* belong to the dev stack, the tests and the benchmarks (skipped below).
_NOT_SETTINGS = frozenset({"RELAY_CONFIG_FILE", "RELAY_CACHE_DIR"})


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _setting(default: Any, help: str, *, internal: bool = False) -> Any:
    """One setting, declared once: its type (the annotation), `default` and meaning (`help`, which
    the README's table shows). `internal`: not a RELAY_ variable of its own."""
    meta = {"help": help, "internal": internal}
    if callable(default):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, repr=False)
class Settings:
    """Everything the relay needs to run; immutable after `load()`. Its `repr` and `rendered()`
    show credentials as `***` (relay.core.redact)."""

    mongodb_uri: str = _setting(
        "mongodb://localhost:27017/?replicaSet=rs0",
        "MongoDB connection string (a replica set: change streams need one)",
    )
    database: str = _setting(
        "app",
        "database holding the outbox collection; with RELAY_OUTBOXES, the database holding the relay's own "
        "state (RELAY_LEASE_COLLECTION and its _replicas)",
    )
    outbox_collection: str = _setting("outbox", "the outbox collection to watch (unless RELAY_OUTBOXES is set)")
    outboxes: str = _setting(
        "",
        "comma-separated database.collection outboxes one deployment publishes, through one change stream per "
        "process and database (empty: the one outbox RELAY_DATABASE.RELAY_OUTBOX_COLLECTION); docs/outboxes.md",
    )
    change_streams: str = _setting(
        "per-database",
        "per-database: one change stream per database holding outboxes; cluster: one stream for the whole "
        "cluster (needs changeStream and find on every database)",
    )
    kafka_bootstrap_servers: str = _setting("localhost:9092", "Kafka bootstrap servers")
    topic_template: str = _setting(
        "outbox.event.{aggregateType}",
        "topic for an event; placeholders {aggregateType}, {eventType}, {database}, {collection} (the outbox's)",
    )
    start_at: str = _setting("oplog-start", "where to start with no checkpoint: oplog-start, now, or an ISO-8601 time")
    instance_id: str = _setting(_default_instance_id, "this replica's name in the lease (default: host name and pid)")
    http_port: int = _setting(8080, "port for /metrics, /livez, /readyz (0 turns the server off)")
    http_host: str = _setting(
        "0.0.0.0",
        "IPv4 address the HTTP server binds (0.0.0.0: every interface; 127.0.0.1: this host only; IPv6 is refused)",
    )
    partitions: int = _setting(
        1,
        "split the outbox into this many partitions by a hash of aggregateId, each with "
        "its own lease and checkpoint, shared by the replicas (1: one lease, as before; "
        "change it only as docs/partitions.md says)",
    )
    lease_collection: str = _setting("outbox_relay_leases", "collection holding the lease and checkpoint documents")
    lease_ttl_s: float = _setting(30.0, "seconds a lease lasts without renewal (server clock)")
    heartbeat_interval_s: float = _setting(
        5.0, "an idle relay stores the post-batch token and renews the lease this often (seconds)"
    )
    standby_poll_s: float = _setting(
        2.0,
        "how often a standby replica tries to take the lease, and every replica writes its heartbeat (seconds)",
    )
    batch_max_events: int = _setting(
        1000,
        "most events handed to Kafka and not yet acknowledged (also what a replica that lost its lease may still publish)",
    )
    batch_max_bytes: int = _setting(
        4 * 1024 * 1024,
        "bytes of encoded messages at which a delivery to the producer closes (a larger read is split; "
        "the message that reaches it is the delivery's last)",
    )
    # Measured on 2 cores shared with mongod and Kafka, depth 1 drained a backlog fastest
    # (README, Benchmarks); deeper pipelines pay off when round trips to remote servers dominate.
    pipeline_depth: int = _setting(
        1, "reads in flight at once, each of RELAY_BATCH_MAX_EVENTS / depth events (1: one batch at a time)"
    )
    max_await_ms: int = _setting(500, "longest a change stream getMore waits for new events (ms)")
    connect_timeout_s: float = _setting(30.0, "how long start-up waits for MongoDB and Kafka (seconds)")
    restart_backoff_max_s: float = _setting(30.0, "longest wait between restarts after transient errors (seconds)")
    on_poison: str = _setting("stop", "a poison event (malformed, not encodable, too large): stop, or dead-letter")
    dead_letter_topic: str = _setting("outbox.deadletter", "topic for poison events when RELAY_ON_POISON=dead-letter")
    outbox_retention: str = _setting(
        "",
        "clean-up by position: delete outbox documents the committed checkpoint covers once older than this "
        "(3600, 90m, 24h, 7d; empty or off: never); docs/outbox-cleanup.md",
    )
    outbox_check_interval_s: float = _setting(
        30.0,
        "how often every replica measures the outbox (size, oldest undelivered, TTL headroom) and the leader "
        "cleans up (seconds)",
    )
    ttl_headroom_warn_s: float = _setting(
        3600.0,
        "with a TTL index on the outbox: WARN and /readyz degraded when its headroom drops below this (seconds)",
    )
    on_history_lost: str = _setting("stop", "checkpoint fell off the oplog: stop, or rescan (re-publish the outbox)")
    on_lease_lost: str = _setting("standby", "after losing the lease: standby (wait to take it again), or exit")
    delivery: str = _setting(
        "at-least-once",
        "at-least-once, or exactly-once: events in Kafka transactions (RELAY_TRANSACTION_MAX_*) with their "
        "resume token written to RELAY_OFFSETS_TOPIC; read_committed consumers see every event once "
        "(docs/exactly-once.md)",
    )
    offsets_topic: str = _setting(
        "outbox-relay.offsets",
        "compacted topic holding each lease's committed resume token (RELAY_DELIVERY=exactly-once; created if missing)",
    )
    ce_source: str = _setting("", "CloudEvents source attribute (default: /outbox-relay/<database>/<collection>)")
    # Measured (docs/exactly-once.md#cost): a commit costs a fixed ~18 ms wait and broker work per
    # partition, so a transaction spans several reads until one of these bounds is reached.
    transaction_max_events: int = _setting(
        10000,
        "exactly-once: most events in one Kafka transaction, which spans several reads until this, "
        "RELAY_TRANSACTION_MAX_BYTES or RELAY_TRANSACTION_MAX_MS is reached",
    )
    transaction_max_bytes: int = _setting(
        16 * 1024 * 1024,
        "exactly-once: bytes of encoded messages at which a Kafka transaction commits (the delivery that "
        "reaches it is the transaction's last)",
    )
    transaction_max_ms: int = _setting(
        100,
        "exactly-once: longest a Kafka transaction stays open (ms); read_committed consumers see an "
        "event at most about this much later than at-least-once",
    )
    schema_registry_url: str = _setting(
        "",
        "Confluent Schema Registry URL(s), comma-separated; set: values use the Confluent wire format "
        "(magic byte 0, 4-byte schema id); empty: Avro single-object encoding, schemas/ is the registry",
    )
    schema_registry_subject_strategy: str = _setting(
        "topic-record",
        "subject a writer schema is registered under: topic (<topic>-value), record "
        "(<record full name>) or topic-record (<topic>-<record full name>)",
    )
    schema_registry_auto_register: bool = _setting(
        True,
        "true: register writer schemas on first use; false: only use schemas registered beforehand",
    )
    schema_registry_basic_auth: str = _setting("", "USER:PASSWORD for the Schema Registry (HTTP basic auth)")
    field_aggregate_type: str = _setting("aggregateType", "outbox field naming the aggregate type")
    field_aggregate_id: str = _setting("aggregateId", "outbox field holding the aggregate id (the Kafka key)")
    field_event_type: str = _setting("eventType", "outbox field holding the event type")
    field_payload: str = _setting("payload", "outbox field holding the event's data")
    field_occurred_at: str = _setting("occurredAt", "outbox field holding when the event happened")
    field_headers: str = _setting("headers", "outbox field holding extra Kafka headers")
    field_topic: str = _setting("topic", "outbox field that overrides the routed topic")
    log_level: str = _setting("INFO", "DEBUG, INFO, WARNING or ERROR")
    log_format: str = _setting(
        "auto", "log lines: json (one object per line), text, or auto (text when stderr is a terminal, else json)"
    )
    kafka: Mapping[str, str] = _setting(dict, "Kafka producer properties (RELAY_KAFKA_<PROPERTY>)", internal=True)

    # ---- the parts' configurations ------------------------------------------------------------

    def parts(self) -> PartConfigs:
        """Each part's own configuration, made from these settings and checked by the part
        (ConfigError names the setting); built once per Settings object. `relay.wiring` hands
        each part its own."""
        return self._parts

    @functools.cached_property
    def _parts(self) -> PartConfigs:
        """Each part's configuration by keyword, so mypy checks every name and type."""
        timing = LeaseTiming(
            lease_ttl_s=self.lease_ttl_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
            standby_poll_s=self.standby_poll_s,
        )
        kafka = self._kafka()
        return PartConfigs(
            loop=self._loop(timing, kafka),
            mongo=MongoConfig(
                uri=Uri(self.mongodb_uri),
                database=self.database,
                outboxes=self.outbox_namespaces,
                change_streams=self.change_streams,
                lease_collection=self.lease_collection,
                connect_timeout_s=self.connect_timeout_s,
                max_await_ms=self.max_await_ms,
            ),
            kafka=kafka,
            encoding=self._encoding(kafka),
            registry=RegistryConfig(
                url=Uri(self.schema_registry_url),
                subject_strategy=self.schema_registry_subject_strategy,
                auto_register=self.schema_registry_auto_register,
                basic_auth=Secret(self.schema_registry_basic_auth),
            ),
            observer=self._observer(timing),
            group=GroupConfig(
                instance_id=self.instance_id, outboxes=self.outbox_namespaces, partitions=self.partitions, timing=timing
            ),
            cleanup=OutboxCleanupConfig(
                retention=self.outbox_retention,
                check_interval_s=self.outbox_check_interval_s,
                ttl_headroom_warn_s=self.ttl_headroom_warn_s,
            ),
        )

    def _loop(self, timing: LeaseTiming, kafka: KafkaConfig) -> LoopConfig:
        return LoopConfig(
            namespace=",".join(self.outbox_namespaces),
            timing=timing,
            max_in_flight_events=self.batch_max_events,
            batch_max_bytes=self.batch_max_bytes,
            pipeline_depth=self.pipeline_depth,
            restart_backoff_max_s=self.restart_backoff_max_s,
            on_poison=self.on_poison,
            on_history_lost=self.on_history_lost,
            on_lease_lost=self.on_lease_lost,
            start_at=self.start_at,
            # The window holds an exactly-once transaction's reads until its commit (relay.core.window).
            transaction_max_events=kafka.transaction_max_events if kafka.exactly_once else None,
        )

    def _kafka(self) -> KafkaConfig:
        return KafkaConfig(
            bootstrap_servers=Uri(self.kafka_bootstrap_servers),
            properties=Properties(self.kafka),
            connect_timeout_s=self.connect_timeout_s,
            delivery=self.delivery,
            offsets_topic=self.offsets_topic,
            transaction_max_events=self.transaction_max_events,
            transaction_max_bytes=self.transaction_max_bytes,
            transaction_max_ms=self.transaction_max_ms,
        )

    def _encoding(self, kafka: KafkaConfig) -> EncodingConfig:
        fields = FieldNames(
            aggregate_type=self.field_aggregate_type,
            aggregate_id=self.field_aggregate_id,
            event_type=self.field_event_type,
            payload=self.field_payload,
            occurred_at=self.field_occurred_at,
            headers=self.field_headers,
            topic=self.field_topic,
        )
        database, _, collection = self.outbox_namespaces[0].partition(".")
        return EncodingConfig(
            database=database,
            collection=collection,
            fields=fields,
            topic_template=self.topic_template,
            ce_source=self.ce_source,
            max_message_bytes=kafka.max_message_bytes,
            dead_letter_topic=self.dead_letter_topic,
        )

    def _observer(self, timing: LeaseTiming) -> ObserverConfig:
        health = HealthConfig(
            connect_timeout_s=self.connect_timeout_s,
            restart_backoff_max_s=self.restart_backoff_max_s,
            timing=timing,
            max_await_ms=self.max_await_ms,
        )
        return ObserverConfig(
            instance_id=self.instance_id,
            outboxes=self.outbox_namespaces,
            http_port=self.http_port,
            http_host=self.http_host,
            dead_letter_topic=self.dead_letter_topic,
            partitions=self.partitions,
            health=health,
        )

    @property
    def namespace(self) -> str:
        """RELAY_DATABASE.RELAY_OUTBOX_COLLECTION: the outbox when RELAY_OUTBOXES is not set."""
        return f"{self.database}.{self.outbox_collection}"

    @functools.cached_property
    def outbox_namespaces(self) -> tuple[str, ...]:
        """The outboxes this deployment publishes: RELAY_OUTBOXES, or the one `namespace`."""
        return parse_outboxes(self.outboxes) or (self.namespace,)

    def pick_outboxes(self, given: str | None, every: bool = True) -> tuple[str, ...]:
        """The outboxes a command acts on: `given` (`--outbox`, one of them), else all of them
        (`every`), else the only one; ConfigError naming --outbox otherwise."""
        names = self.outbox_namespaces
        if given is not None:
            if given not in names:
                raise ConfigError("--outbox", f"{given!r} is not one of the outboxes: {', '.join(names)}")
            return (given,)
        if every or len(names) == 1:
            return names
        raise ConfigError("--outbox", f"name the outbox to act on, one of: {', '.join(names)}")

    def kafka_client_config(self) -> dict[str, str]:
        """The configuration of the relay's other Kafka clients (KafkaConfig.client_config)."""
        return self.parts().kafka.client_config()

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    # ---- credentials ----------------------------------------------------------------------

    def rendered(self) -> dict[str, Any]:
        """The settings as they may be shown: every credential as `***`, URIs as `user:***@`."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return redact_mapping(values)

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in self.rendered().items()) + ")"

    def secrets(self) -> list[str]:
        """The credential values these settings carry (URI passwords, basic auth, password-like
        Kafka properties), for `relay.core.redact.register_secrets`."""
        found = uri_credentials(self.mongodb_uri) + uri_secrets(self.schema_registry_url)
        if self.schema_registry_basic_auth:
            found += [self.schema_registry_basic_auth, self.schema_registry_basic_auth.partition(":")[2]]
        found += [v for k, value in self.kafka.items() for v in credential_values(k, value)]
        return found

    # ---- loading --------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        flags: Mapping[str, Any] | None = None,
        kafka_flags: Mapping[str, str] | None = None,
        config_file: str | None = None,
    ) -> Settings:
        """Merge the sources, parse and validate; raises ConfigError naming the bad setting."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        kafka: dict[str, str] = {}
        path = config_file or env.get("RELAY_CONFIG_FILE")
        if path:
            file_values, file_kafka = _read_toml(path)
            values.update(file_values)
            kafka.update(file_kafka)
        names = {f.name for f in _public_fields()}
        for key, raw in env.items():
            if not key.startswith(ENV_PREFIX) or key in _NOT_SETTINGS:
                continue
            name = key[len(ENV_PREFIX) :].lower()
            if name in names:
                values[name] = (raw, key)
            elif key.startswith(KAFKA_ENV_PREFIX):
                kafka[key[len(KAFKA_ENV_PREFIX) :].lower().replace("_", ".")] = raw
            elif name.startswith(("dev_", "test_", "bench_")):
                continue  # read by the dev stack, the tests and the benchmarks, not the relay
            else:
                raise ConfigError(key, _unknown(name, names, env_name))
        for name, raw in (flags or {}).items():
            if raw is not None:
                values[name] = (raw, flag_name(name))
        kafka.update(kafka_flags or {})
        parsed = {name: _parse(name, raw, source) for name, (raw, source) in values.items()}
        settings = cls(**parsed, kafka=dict(kafka))
        register_secrets(settings.secrets())  # before validating: a refused value is masked too
        settings.validate()
        return settings

    def validate(self) -> None:
        """Check every part's configuration (each failure names the setting), the logging
        settings, and what no single part can: exactly-once mode needs one delivery in flight."""
        self.parts()
        check_logging(self.log_level, self.log_format)
        if self.delivery == EXACTLY_ONCE and self.pipeline_depth != 1:
            raise ConfigError(
                env_name("pipeline_depth"),
                f"must be 1 with RELAY_DELIVERY=exactly-once (one Kafka transaction at a time), "
                f"got {self.pipeline_depth}",
            )


@dataclass(frozen=True)
class PartConfigs:
    """The configuration of each part, made from the settings (`Settings.parts`)."""

    loop: LoopConfig
    mongo: MongoConfig
    kafka: KafkaConfig
    encoding: EncodingConfig
    registry: RegistryConfig
    observer: ObserverConfig
    group: GroupConfig
    cleanup: OutboxCleanupConfig

    def scopes(self) -> list[Scope]:
        """What this deployment's relay loops publish: every outbox in every partition."""
        return scopes(self.mongo.outboxes, self.group.partitions)

    def lease_document(self, client: MongoClient[Any], scope: Scope) -> LeaseDocument:
        """The operator's view of `scope`'s lease document (relay.mongo.lease_admin)."""
        return LeaseDocument(self.mongo.leases(client), scope.lease_id)

    def lease_store(self, client: MongoClient[Any], scope: Scope) -> LeaseStore:
        """The lease document of `scope` for this replica: the one way the running relay, the
        group's start-up and the commands build it."""
        return LeaseStore(
            self.mongo.leases(client),
            scope,
            self.group.instance_id,
            self.group.timing.lease_ttl_s,
            delivery=self.kafka.delivery,
        )

    def encoding_for(self, namespace: str) -> EncodingConfig:
        """How the events of the outbox `namespace` become messages (its database and collection
        in the CloudEvents source and the topic template)."""
        database, _, collection = namespace.partition(".")
        return dataclasses.replace(self.encoding, database=database, collection=collection)


def _public_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Settings) if not f.metadata.get("internal")]


def parse_outboxes(text: str) -> tuple[str, ...]:
    """RELAY_OUTBOXES as namespaces, in the order given; ConfigError names a malformed or repeated one."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        database, dot, collection = name.partition(".")
        if not dot or not database or not collection or any(c in database for c in ' /\\"$.'):
            raise ConfigError(env_name("outboxes"), f"expected database.collection outboxes, got {name!r}")
        if "$" in collection or collection.startswith("system."):
            raise ConfigError(env_name("outboxes"), f"not a collection an outbox can be: {name!r}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(env_name("outboxes"), f"lists {', '.join(repeated)} more than once")
    return names


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


_HINTS = typing.get_type_hints(Settings)


def _parse(name: str, raw: Any, source: str) -> Any:
    kind = _HINTS[name]
    if isinstance(raw, kind):
        return raw
    if kind is bool:
        if str(raw).strip().lower() not in ("true", "false"):
            raise ConfigError(source, f"must be true or false, got {raw!r}")
        return str(raw).strip().lower() == "true"
    try:
        if kind is int:
            return int(str(raw).strip())
        if kind is float:
            return float(str(raw).strip())
        return str(raw)
    except ValueError as exc:
        raise ConfigError(source, f"must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from exc


def _read_toml(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError("RELAY_CONFIG_FILE", f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("RELAY_CONFIG_FILE", f"{path} is not valid TOML: {exc}") from exc
    names = {f.name for f in _public_fields()}
    kafka = {str(k): str(v) for k, v in data.pop("kafka", {}).items()}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{path}: {key}", _unknown(str(key), names, str))
        values[key] = (value, f"{path}: {key}")
    return values, kafka


def _unknown(name: str, names: set[str], spell: Callable[[str], str]) -> str:
    """The one-line refusal of an unknown setting: the closest known name (difflib), if any,
    spelled as the source spells it (`RELAY_OUTBOXES` in the environment, `outboxes` in TOML);
    never the whole list of known names."""
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f"unknown setting; did you mean {spell(close[0])}?" if close else "unknown setting"


def parse_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    """`KEY=VALUE` arguments of a repeatable flag, as a dict; a malformed one names the flag and
    its position, never its text (it may be a credential: `sasl.password S3cret`), and the value
    of a password-like key is registered for masking (relay.core.redact) at once."""
    pairs: dict[str, str] = {}
    for n, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                flag, f"expected KEY=VALUE, but item {n} of {flag} has no '=' before its value (not shown)"
            )
        pairs[key.strip()] = value
    register_secrets(v for key, value in pairs.items() for v in credential_values(key, value))
    return pairs


def settings_parser() -> argparse.ArgumentParser:
    """Flags for every setting (same names as RELAY_* variables), shared by the commands and the
    Spark jobs (a parent parser: `argparse.ArgumentParser(parents=[settings_parser()])`)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("settings (each also RELAY_<NAME>)")
    for f in _public_fields():
        group.add_argument(
            flag_name(f.name), dest=f.name, default=None, metavar="V", help=f"{f.metadata['help']} [{env_name(f.name)}]"
        )
    group.add_argument(
        "--kafka-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Kafka producer property, e.g. compression.type=zstd [RELAY_KAFKA_*]",
    )
    group.add_argument(
        "--config", dest="config_file", default=None, metavar="FILE", help="TOML file with settings [RELAY_CONFIG_FILE]"
    )
    return parent


def load_settings(args: argparse.Namespace) -> Settings:
    """Settings from defaults, file, environment and the flags of `settings_parser()` (validated)."""
    names = {f.name for f in _public_fields()}
    flags = {k: v for k, v in vars(args).items() if k in names}
    kafka = parse_pairs(args.kafka_property, "--kafka-property")
    return Settings.load(flags=flags, kafka_flags=kafka, config_file=args.config_file)


def _shown(default: Any) -> str:
    """A default as a user writes it (`true`, not `True`)."""
    return str(default).lower() if isinstance(default, bool) else str(default)


# The README's configuration table is generated from this list (see tests/unit/test_config.py).
SETTINGS_DOC: list[tuple[str, str, str]] = [
    (
        env_name(f.name),
        _shown(f.default) if f.default is not dataclasses.MISSING else "host name and pid",
        f.metadata["help"],
    )
    for f in _public_fields()
]


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{env}` | `{default}` | {meaning} |" for env, default, meaning in SETTINGS_DOC]
    return "\n".join(rows)

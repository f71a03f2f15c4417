"""Settings: one frozen object, every field with its default and meaning beside it.

Sources, later ones win: defaults < TOML file (`--config` / `RELAY_CONFIG_FILE`) <
environment (`RELAY_<FIELD>`) < command-line flags (`--<field-with-dashes>`).
Kafka client properties pass through: `RELAY_KAFKA_COMPRESSION_TYPE=zstd` sets
`compression.type`; so do `--kafka-property compression.type=zstd` and a `[kafka]` table in
the TOML file. `Settings.load()` validates everything once: `parts()` makes each part's own
small configuration (the loop's, MongoDB's, Kafka's, the encoder's, ...), which checks its
values where they are used; any problem raises `ConfigError` naming the setting. Only the wiring
(relay.wiring) and the commands read Settings; every part below them gets its own configuration. The README's configuration table is generated from `SETTINGS_DOC` and a
test checks the two agree. `settings_parser()` gives every command (and the Spark jobs) the
same flags, and `load_settings()` turns parsed flags into Settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import socket
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relay.avro.config import EncodingConfig, RegistryConfig
from relay.core.config import LoopConfig, parse_start_time
from relay.core.errors import ENV_PREFIX, KAFKA_ENV_PREFIX, ConfigError, env_name, kafka_env_name
from relay.group.config import GroupConfig
from relay.kafka.config import KafkaConfig
from relay.mongo.config import MongoConfig, OutboxCleanupConfig
from relay.ops.config import HealthConfig, ObserverConfig, check_logging
from relay.outbox import FieldNames

__all__ = [
    "SETTINGS_DOC",
    "Parts",
    "Settings",
    "env_name",
    "flag_name",
    "kafka_env_name",
    "load_settings",
    "markdown_table",
    "parse_pairs",
    "settings_parser",
]


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _setting(default: Any, help: str, **kw: Any) -> Any:
    if callable(default):
        return field(default_factory=default, metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Settings:
    """Everything the relay needs to run; immutable after `load()`."""

    mongodb_uri: str = _setting(
        "mongodb://localhost:27017/?replicaSet=rs0",
        "MongoDB connection string (a replica set: change streams need one)",
    )
    database: str = _setting("app", "database holding the outbox collection")
    outbox_collection: str = _setting("outbox", "the outbox collection to watch")
    kafka_bootstrap_servers: str = _setting("localhost:9092", "Kafka bootstrap servers")
    topic_template: str = _setting(
        "outbox.event.{aggregateType}", "topic for an event; placeholders {aggregateType}, {eventType}"
    )
    start_at: str = _setting("oplog-start", "where to start with no checkpoint: oplog-start, now, or an ISO-8601 time")
    instance_id: str = _setting(_default_instance_id, "this replica's name in the lease (default: host name and pid)")
    http_port: int = _setting(8080, "port for /metrics, /livez, /readyz (0 turns the server off)")
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
    standby_poll_s: float = _setting(2.0, "how often a standby replica tries to take the lease (seconds)")
    batch_max_events: int = _setting(
        1000,
        "most events handed to Kafka and not yet acknowledged (also what a replica that lost its lease may still publish)",
    )
    batch_max_bytes: int = _setting(
        4 * 1024 * 1024, "most bytes of encoded messages in one batch (a larger batch is split)"
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
        "how often the leader measures the outbox (size, oldest undelivered, TTL headroom) and cleans up (seconds)",
    )
    ttl_headroom_warn_s: float = _setting(
        3600.0, "with a TTL index on the outbox: WARN and /readyz degraded when its headroom drops below this (seconds)"
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
    # Measured (docs/exactly-once.md#cost): a commit costs a fixed ~18 ms wait and broker work per
    # partition, so a transaction spans several reads until one of these bounds is reached.
    transaction_max_events: int = _setting(
        10000,
        "exactly-once: most events in one Kafka transaction, which spans several reads until this, "
        "RELAY_TRANSACTION_MAX_BYTES or RELAY_TRANSACTION_MAX_MS is reached",
    )
    transaction_max_bytes: int = _setting(
        16 * 1024 * 1024, "exactly-once: most bytes of encoded messages in one Kafka transaction"
    )
    transaction_max_ms: int = _setting(
        100,
        "exactly-once: longest a Kafka transaction stays open (ms); read_committed consumers see an "
        "event at most about this much later than at-least-once",
    )
    ce_source: str = _setting("", "CloudEvents source attribute (default: /outbox-relay/<database>/<collection>)")
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
    schema_registry_auto_register: str = _setting(
        "true", "true: register writer schemas on first use; false: only use schemas registered beforehand"
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

    def parts(self) -> Parts:
        """Each part's own configuration, made from these settings and checked by the part
        (ConfigError names the setting). `relay.wiring` hands each part its own."""
        kafka = KafkaConfig(
            self.kafka_bootstrap_servers,
            dict(self.kafka),
            self.connect_timeout_s,
            self.delivery,
            self.offsets_topic,
            self.transaction_max_events,
            self.transaction_max_bytes,
            self.transaction_max_ms,
        )
        fields = FieldNames(
            self.field_aggregate_type,
            self.field_aggregate_id,
            self.field_event_type,
            self.field_payload,
            self.field_occurred_at,
            self.field_headers,
            self.field_topic,
        )
        auto_register = self.schema_registry_auto_register.lower()
        if auto_register not in ("true", "false"):
            raise ConfigError(
                env_name("schema_registry_auto_register"),
                f"must be true or false, got {self.schema_registry_auto_register!r}",
            )
        health = HealthConfig(
            self.connect_timeout_s, self.restart_backoff_max_s, self.standby_poll_s, self.max_await_ms
        )
        return Parts(
            loop=LoopConfig(
                self.namespace,
                self.batch_max_events,
                self.batch_max_bytes,
                self.pipeline_depth,
                self.lease_ttl_s,
                self.heartbeat_interval_s,
                self.standby_poll_s,
                self.restart_backoff_max_s,
                self.on_poison,
                self.on_history_lost,
                self.on_lease_lost,
                self.start_at,
                self.transaction_max_events if kafka.exactly_once else None,
            ),
            mongo=MongoConfig(
                self.mongodb_uri,
                self.database,
                self.outbox_collection,
                self.lease_collection,
                self.connect_timeout_s,
                self.max_await_ms,
            ),
            kafka=kafka,
            encoding=EncodingConfig(
                self.database,
                self.outbox_collection,
                fields,
                self.topic_template,
                self.ce_source,
                kafka.max_message_bytes,
                self.dead_letter_topic,
            ),
            registry=RegistryConfig(
                self.schema_registry_url,
                self.schema_registry_subject_strategy,
                auto_register == "true",
                self.schema_registry_basic_auth,
            ),
            observer=ObserverConfig(
                self.instance_id, self.namespace, self.http_port, self.dead_letter_topic, self.partitions, health
            ),
            group=GroupConfig(self.instance_id, self.namespace, self.partitions, self.standby_poll_s, self.lease_ttl_s),
            cleanup=OutboxCleanupConfig(self.outbox_retention, self.outbox_check_interval_s, self.ttl_headroom_warn_s),
        )

    @property
    def namespace(self) -> str:
        return f"{self.database}.{self.outbox_collection}"

    def kafka_config(self) -> dict[str, str]:
        """The producer configuration (relay.kafka.config.KafkaConfig.producer_config)."""
        return self.parts().kafka.producer_config()

    def kafka_client_config(self) -> dict[str, str]:
        """The configuration of the relay's other Kafka clients (KafkaConfig.client_config)."""
        return self.parts().kafka.client_config()

    def start_at_time(self) -> dt.datetime | None:
        """The operator-given start time, or None for `oplog-start` / `now`."""
        return None if self.start_at in ("oplog-start", "now") else parse_start_time(self.start_at)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

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
            if not key.startswith(ENV_PREFIX) or key == "RELAY_CONFIG_FILE":
                continue
            name = key[len(ENV_PREFIX) :].lower()
            if name in names:
                values[name] = (raw, key)
            elif key.startswith(KAFKA_ENV_PREFIX):
                kafka[key[len(KAFKA_ENV_PREFIX) :].lower().replace("_", ".")] = raw
            elif name.startswith(("dev_", "test_", "bench_")):
                continue  # read by the dev stack, the tests and the benchmarks, not the relay
            else:
                raise ConfigError(key, f"unknown setting; known: {', '.join(sorted(env_name(n) for n in names))}")
        for name, raw in (flags or {}).items():
            if raw is not None:
                values[name] = (raw, flag_name(name))
        kafka.update(kafka_flags or {})
        parsed = {name: _parse(name, raw, source) for name, (raw, source) in values.items()}
        settings = cls(**parsed, kafka=dict(kafka))
        settings.validate()
        return settings

    def validate(self) -> None:
        """Check every part's configuration (each failure names the setting), the logging
        settings, and what no single part can: exactly-once mode needs one delivery in flight."""
        self.parts()
        check_logging(self.log_level, self.log_format)
        if self.delivery == "exactly-once" and self.pipeline_depth != 1:
            raise ConfigError(
                env_name("pipeline_depth"),
                f"must be 1 with RELAY_DELIVERY=exactly-once (one Kafka transaction at a time), "
                f"got {self.pipeline_depth}",
            )


@dataclass(frozen=True)
class Parts:
    """The configuration of each part, made from the settings (`Settings.parts`)."""

    loop: LoopConfig
    mongo: MongoConfig
    kafka: KafkaConfig
    encoding: EncodingConfig
    registry: RegistryConfig
    observer: ObserverConfig
    group: GroupConfig
    cleanup: OutboxCleanupConfig


def _public_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Settings) if not f.metadata.get("internal")]


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


_HINTS = typing.get_type_hints(Settings)


def _parse(name: str, raw: Any, source: str) -> Any:
    kind = _HINTS[name]
    if isinstance(raw, kind):
        return raw
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
            raise ConfigError(f"{path}: {key}", "unknown setting")
        values[key] = (value, f"{path}: {key}")
    return values, kafka


def parse_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    """`KEY=VALUE` arguments of a repeatable flag, as a dict; a malformed one names the flag."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(flag, f"expected KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value
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


# The README's configuration table is generated from this list (see tests/unit/test_config.py).
SETTINGS_DOC: list[tuple[str, str, str]] = [
    (
        env_name(f.name),
        str(f.default) if f.default is not dataclasses.MISSING else "host name and pid",
        f.metadata["help"],
    )
    for f in _public_fields()
]


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{env}` | `{default}` | {meaning} |" for env, default, meaning in SETTINGS_DOC]
    return "\n".join(rows)

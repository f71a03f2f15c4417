"""The settings table: one frozen object, every setting declared once with its type, default and
meaning (`_setting`), and the values read from them alone (the outboxes, the credentials, how they
are shown). The README's configuration table is generated from these declarations
(relay.config.doc).

`SettingsTable` holds the declarations; `relay.config.settings.Settings` is the object users load
(`Settings.load()`: the sources read, every part's configuration built from this table by
relay.config.parts and checked). So parts.py reads the table, settings.py reads both, and neither
of the two modules below it reads the one above.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from relay.config.sources import parse_outboxes
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.namespace import Namespace, NamespaceError
from relay.core.redact import credential_values, redact_mapping, uri_secrets
from relay.mongo.config import uri_credentials


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
class SettingsTable:
    """Every setting, declared once; immutable. Its `repr` and `rendered()` show credentials as
    `***` (relay.core.redact). Users hold the `Settings` subclass (relay.config.settings)."""

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
    broker: str = _setting(
        "kafka",
        "where events are published: kafka, nats (JetStream: RELAY_NATS_*, docs/nats.md), or rabbitmq "
        "(RELAY_RABBITMQ_*, docs/rabbitmq.md)",
    )
    kafka_bootstrap_servers: str = _setting("localhost:9092", "Kafka bootstrap servers")
    nats_servers: str = _setting(
        "nats://localhost:4222", "RELAY_BROKER=nats: comma-separated nats:// or tls:// server URLs"
    )
    nats_stream: str = _setting(
        "OUTBOX",
        "RELAY_BROKER=nats: the JetStream stream the subjects are stored in (used as the operator made it; "
        "created if missing unless RELAY_NATS_CREATE_STREAM=false)",
    )
    nats_create_stream: bool = _setting(
        True, "RELAY_BROKER=nats: create the stream when it does not exist (false: stop, naming it)"
    )
    nats_creds: str = _setting("", "RELAY_BROKER=nats: a .creds file (user JWT and NKey seed) to connect with")
    nats_user: str = _setting("", "RELAY_BROKER=nats: user name to connect with (with RELAY_NATS_PASSWORD)")
    nats_password: str = _setting("", "RELAY_BROKER=nats: password of RELAY_NATS_USER")
    nats_token: str = _setting("", "RELAY_BROKER=nats: token to connect with")
    nats_tls_ca: str = _setting("", "RELAY_BROKER=nats: CA certificate file for tls:// servers (empty: the system's)")
    nats_ack_timeout_ms: int = _setting(
        5000,
        "RELAY_BROKER=nats: longest a publish waits for JetStream's acknowledgement before the relay "
        "publishes again from its stored checkpoint (ms)",
    )
    nats_duplicate_window_s: float = _setting(
        120.0,
        "RELAY_BROKER=nats: the duplicate window of a stream the relay creates (seconds): a republished "
        "event within it is dropped by the server (Nats-Msg-Id)",
    )
    rabbitmq_url: str = _setting(
        "amqp://localhost:5672/%2F",
        "RELAY_BROKER=rabbitmq: the amqp:// or amqps:// URL of the server (user and password, default guest; host, port, "
        "virtual host; shown masked)",
    )
    rabbitmq_exchange: str = _setting(
        "outbox",
        "RELAY_BROKER=rabbitmq: the durable topic exchange events are published to, the topic as routing key "
        "(declared if missing; the relay never declares or binds queues)",
    )
    rabbitmq_tls_ca: str = _setting("", "RELAY_BROKER=rabbitmq: CA certificate file for amqps:// (empty: the system's)")
    rabbitmq_confirm_timeout_ms: int = _setting(
        10000,
        "RELAY_BROKER=rabbitmq: longest a publish waits for RabbitMQ's publisher confirm before the relay "
        "publishes again from its stored checkpoint (ms)",
    )
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
    checkpoint_interval_ms: int = _setting(
        1000,
        "most often the checkpoints one process leads are stored, together in one write, after delivered "
        "batches (ms; 0: after every batch); after a crash the events of about this long are published again",
    )
    checkpoint_max_events: int = _setting(
        10_000,
        "most events acknowledged before the checkpoints are stored, whatever RELAY_CHECKPOINT_INTERVAL_MS says "
        "(bounds the duplicates after a crash during a catch-up)",
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
        "bytes of encoded messages at which a parcel (messages handed to the producer together) closes "
        "(a larger read is split; the message that reaches it is the parcel's last)",
    )
    # Measured on 2 cores shared with mongod and Kafka, depth 1 drained a backlog fastest
    # (README, Benchmarks); deeper pipelines pay off when round trips to remote servers dominate.
    pipeline_depth: int = _setting(
        1, "reads in flight at once, each of RELAY_BATCH_MAX_EVENTS / depth events (1: one batch at a time)"
    )
    max_await_ms: int = _setting(500, "longest a change stream getMore waits for new events (ms)")
    read_linger_ms: int = _setting(
        10,
        "after a read that returned events but did not fill, how long the next read waits for more to gather "
        "(ms; 0: at once); fewer reads and batches at low rates, for about this much more latency",
    )
    connect_timeout_s: float = _setting(30.0, "how long start-up waits for MongoDB and Kafka (seconds)")
    restart_backoff_max_s: float = _setting(30.0, "longest wait between restarts after transient errors (seconds)")
    on_poison: str = _setting("stop", "a poison event (malformed, not encodable, too large): stop, or dead-letter")
    dead_letter_topic: str = _setting("outbox.deadletter", "topic for poison events when RELAY_ON_POISON=dead-letter")
    outbox_retention: str = _setting(
        "",
        "clean-up by checkpoint: delete outbox documents the stored checkpoint covers once older than this "
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
        "compacted topic holding each lease's resume token, written inside its Kafka transactions (RELAY_DELIVERY=exactly-once; created if missing)",
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
        "exactly-once: bytes of encoded messages at which a Kafka transaction commits (the parcel that "
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

    # ---- the outboxes ---------------------------------------------------------------------------

    @functools.cached_property
    def namespaces(self) -> tuple[Namespace, ...]:
        """The outboxes this deployment publishes: RELAY_OUTBOXES, or the one
        RELAY_DATABASE.RELAY_OUTBOX_COLLECTION. The one view of the list: what shows it as text
        writes `str(namespace)`."""
        listed = parse_outboxes(self.outboxes)
        if listed:
            return listed
        for setting in ("database", "outbox_collection"):
            if not getattr(self, setting).strip():
                raise ConfigError(env_name(setting), "must not be empty")
        try:
            return (Namespace(self.database, self.outbox_collection),)
        except NamespaceError as exc:
            raise ConfigError(env_name("database"), str(exc)) from exc

    def pick_outboxes(self, given: str | Sequence[str] | None, every: bool = True) -> tuple[Namespace, ...]:
        """The outboxes a command acts on, the one way every command picks them: those `given`
        (`--outbox`, once or, for `replay`, repeated; each one of the outboxes, in the order given,
        each once), else all of them (`every`), else the only one; ConfigError naming --outbox
        otherwise, and the setting the outboxes come from (RELAY_OUTBOXES when it is set, else
        RELAY_DATABASE and RELAY_OUTBOX_COLLECTION)."""
        named = {str(n): n for n in self.namespaces}  # a name given is matched, never parsed
        wanted = [given] if isinstance(given, str) else list(given or [])
        for name in wanted:
            if name not in named:
                raise ConfigError("--outbox", f"{name!r} is not one of the outboxes ({self._outboxes_source()})")
        if wanted:
            return tuple(named[name] for name in dict.fromkeys(wanted))
        if every or len(named) == 1:
            return self.namespaces
        raise ConfigError("--outbox", f"name the outbox to act on, one of: {', '.join(named)}")

    def _outboxes_source(self) -> str:
        """Where the outboxes come from, as a refusal names it: `RELAY_OUTBOXES: a.b, c.d`, or
        `RELAY_DATABASE.RELAY_OUTBOX_COLLECTION: app.outbox` when RELAY_OUTBOXES is not set."""
        listed = ", ".join(str(n) for n in self.namespaces)
        if parse_outboxes(self.outboxes):
            return f"{env_name('outboxes')}: {listed}"
        return f"{env_name('database')}.{env_name('outbox_collection')}: {listed}"

    def replace(self, **changes: Any) -> Self:
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
        found += uri_secrets(self.nats_servers) + [s for s in (self.nats_password, self.nats_token) if s]
        found += uri_secrets(self.rabbitmq_url)
        return found


def public_fields() -> list[dataclasses.Field[Any]]:
    """The settings that are RELAY_ variables of their own, in declaration order."""
    return [f for f in dataclasses.fields(SettingsTable) if not f.metadata.get("internal")]


def public_types() -> dict[str, type]:
    """Each public setting's name and type, for the sources' parser."""
    hints = typing.get_type_hints(SettingsTable)
    return {f.name: hints[f.name] for f in public_fields()}

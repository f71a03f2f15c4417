"""Each part's own configuration, made from the settings by keyword (mypy checks every name and
type); each part checks its own values in its constructor, ConfigError naming the setting.
`relay.wiring` hands each part its own; nothing here builds a client or a lease object."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from relay.avro.config import EncodingConfig, RegistryConfig
from relay.config.table import SettingsTable
from relay.core.config import LeaseTiming, LoopConfig
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.core.partitions import Scope, scopes
from relay.core.redact import Properties, Secret, Uri
from relay.group.config import GroupConfig
from relay.kafka.config import KafkaConfig
from relay.mongo.config import MongoConfig, OutboxCleanupConfig
from relay.nats.config import NatsConfig
from relay.ops.config import HealthConfig, ObserverConfig
from relay.outbox import FieldNames
from relay.rabbitmq.config import RabbitConfig


@dataclass(frozen=True)
class PartConfigs:
    """The configuration of each part, made from the settings (`Settings.parts`), and the outboxes
    they serve, held here once: a part that acts on the outboxes is handed them (or one of them)
    by the wiring, never a copy in its own configuration."""

    outboxes: tuple[Namespace, ...]  # RELAY_OUTBOXES, or the one RELAY_DATABASE.RELAY_OUTBOX_COLLECTION
    loop: LoopConfig
    mongo: MongoConfig
    broker: str  # RELAY_BROKER: which of the broker parts below the relay publishes to
    kafka: KafkaConfig
    nats: NatsConfig
    rabbitmq: RabbitConfig
    encoding: EncodingConfig
    registry: RegistryConfig
    observer: ObserverConfig
    group: GroupConfig
    cleanup: OutboxCleanupConfig

    def scopes(self) -> list[Scope]:
        """What this deployment's relay loops publish: every outbox in every partition."""
        return scopes(self.outboxes, self.group.partitions)

    def encoding_for(self, namespace: Namespace) -> EncodingConfig:
        """How the events of the outbox `namespace` become messages (its database and collection
        in the CloudEvents source and the topic template)."""
        return dataclasses.replace(self.encoding, outbox=namespace)


def part_configs(s: SettingsTable) -> PartConfigs:
    """Each part's configuration from the settings `s`."""
    timing = LeaseTiming(
        lease_ttl_s=s.lease_ttl_s,
        heartbeat_interval_s=s.heartbeat_interval_s,
        standby_poll_s=s.standby_poll_s,
    )
    kafka = _kafka(s)
    return PartConfigs(
        outboxes=s.namespaces,
        loop=_loop(s, timing, kafka),
        mongo=_mongo(s),
        broker=_broker(s),
        kafka=kafka,
        nats=_nats(s),
        rabbitmq=_rabbitmq(s),
        encoding=_encoding(s, kafka),
        registry=RegistryConfig(
            url=Uri(s.schema_registry_url),
            subject_strategy=s.schema_registry_subject_strategy,
            auto_register=s.schema_registry_auto_register,
            basic_auth=Secret(s.schema_registry_basic_auth),
        ),
        observer=_observer(s, timing),
        group=GroupConfig(instance_id=s.instance_id, partitions=s.partitions, timing=timing),
        cleanup=OutboxCleanupConfig(
            retention=s.outbox_retention,
            check_interval_s=s.outbox_check_interval_s,
            ttl_headroom_warn_s=s.ttl_headroom_warn_s,
        ),
    )


def _mongo(s: SettingsTable) -> MongoConfig:
    return MongoConfig(
        uri=Uri(s.mongodb_uri),
        database=s.database,
        change_streams=s.change_streams,
        lease_collection=s.lease_collection,
        connect_timeout_s=s.connect_timeout_s,
        max_await_ms=s.max_await_ms,
        read_linger_ms=s.read_linger_ms,
    )


def _loop(s: SettingsTable, timing: LeaseTiming, kafka: KafkaConfig) -> LoopConfig:
    return LoopConfig(
        timing=timing,
        max_in_flight_events=s.batch_max_events,
        batch_max_bytes=s.batch_max_bytes,
        pipeline_depth=s.pipeline_depth,
        restart_backoff_max_s=s.restart_backoff_max_s,
        checkpoint_interval_ms=s.checkpoint_interval_ms,
        checkpoint_max_events=s.checkpoint_max_events,
        on_poison=s.on_poison,
        on_history_lost=s.on_history_lost,
        on_lease_lost=s.on_lease_lost,
        start_at=s.start_at,
        # The window holds an exactly-once transaction's reads until its commit (relay.core.window).
        transaction_max_events=kafka.transaction_max_events if kafka.exactly_once and s.broker == "kafka" else None,
    )


BROKERS = ("kafka", "nats", "rabbitmq")  # RELAY_BROKER
NO_SIZE_LIMIT = 2**31 - 1  # no message is this large: MongoDB's documents stop at 16 MiB


def _broker(s: SettingsTable) -> str:
    if s.broker not in BROKERS:
        raise ConfigError(env_name("broker"), f"must be one of {', '.join(BROKERS)}; got {s.broker!r}")
    return s.broker


def _nats(s: SettingsTable) -> NatsConfig:
    return NatsConfig(
        servers=Uri(s.nats_servers),
        stream=s.nats_stream,
        creds_file=s.nats_creds,
        user=s.nats_user,
        password=Secret(s.nats_password),
        token=Secret(s.nats_token),
        tls_ca=s.nats_tls_ca,
        create_stream=s.nats_create_stream,
        ack_timeout_ms=s.nats_ack_timeout_ms,
        duplicate_window_s=s.nats_duplicate_window_s,
        connect_timeout_s=s.connect_timeout_s,
        delivery=s.delivery,
    )


def _kafka(s: SettingsTable) -> KafkaConfig:
    return KafkaConfig(
        bootstrap_servers=Uri(s.kafka_bootstrap_servers),
        properties=Properties(s.kafka),
        connect_timeout_s=s.connect_timeout_s,
        delivery=s.delivery,
        offsets_topic=s.offsets_topic,
        transaction_max_events=s.transaction_max_events,
        transaction_max_bytes=s.transaction_max_bytes,
        transaction_max_ms=s.transaction_max_ms,
    )


def _rabbitmq(s: SettingsTable) -> RabbitConfig:
    return RabbitConfig(
        url=Uri(s.rabbitmq_url),
        exchange=s.rabbitmq_exchange,
        tls_ca=s.rabbitmq_tls_ca,
        confirm_timeout_ms=s.rabbitmq_confirm_timeout_ms,
        connect_timeout_s=s.connect_timeout_s,
        delivery=s.delivery,
    )


def _encoding(s: SettingsTable, kafka: KafkaConfig) -> EncodingConfig:
    fields = FieldNames(
        aggregate_type=s.field_aggregate_type,
        aggregate_id=s.field_aggregate_id,
        event_type=s.field_event_type,
        payload=s.field_payload,
        occurred_at=s.field_occurred_at,
        headers=s.field_headers,
        topic=s.field_topic,
    )
    return EncodingConfig(
        outbox=s.namespaces[0],  # each outbox's own: PartConfigs.encoding_for
        fields=fields,
        topic_template=s.topic_template,
        ce_source=s.ce_source,
        # Kafka's limit is known from its properties; another broker's is checked by its publisher
        # against what the server announces (relay.nats.messages: NATS's max_payload).
        max_message_bytes=kafka.max_message_bytes if s.broker == "kafka" else NO_SIZE_LIMIT,
        dead_letter_topic=s.dead_letter_topic,
    )


def _observer(s: SettingsTable, timing: LeaseTiming) -> ObserverConfig:
    health = HealthConfig(
        connect_timeout_s=s.connect_timeout_s,
        restart_backoff_max_s=s.restart_backoff_max_s,
        timing=timing,
        max_await_ms=s.max_await_ms,
    )
    return ObserverConfig(
        broker=s.broker,
        instance_id=s.instance_id,
        http_port=s.http_port,
        http_host=s.http_host,
        dead_letter_topic=s.dead_letter_topic,
        partitions=s.partitions,
        health=health,
    )

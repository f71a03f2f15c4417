"""`Inbox.run`'s options: one frozen object, every field with its default, checked once at start.

Unknown options and librdkafka settings the inbox owns raise `ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from relay.core.config import AT_LEAST_ONCE, POISON_POLICIES, positive
from relay.core.errors import ConfigError
from relay.core.redact import Uri, credential_values, redact_mapping, register_secrets, uri_secrets
from relay.rabbitmq.config import RabbitConfig

# librdkafka settings with the inbox's own defaults (`kafka` may change them): librdkafka's
# statistics carry each assigned partition's lag (relay_inbox_lag_messages), refreshed this often;
# "0" turns them, and the lag series, off.
CONSUMER_DEFAULTS = {"statistics.interval.ms": "5000"}

# How long the inbox's RabbitMQ dead letters wait for their publisher confirm.
RABBITMQ_CONFIRM_TIMEOUT_MS = 30_000

# librdkafka settings the guarantee rests on: set by the inbox, refused in `kafka`.
FORCED_CONSUMER_SETTINGS = {
    "isolation.level": "read_committed",  # messages of aborted Kafka transactions are never seen
    "enable.auto.commit": "false",  # offsets are committed only after the MongoDB transaction
    "enable.auto.offset.store": "false",
}


@dataclass(frozen=True)
class RunOptions:
    """What `Inbox.run(handler, *, topics, group_id, bootstrap_servers, **options)` takes: Kafka's
    `bootstrap_servers`, NATS JetStream's `nats_servers` (`topics` are then subjects of
    `nats_stream`, `group_id` the durable consumer: relay.inbox.jetstream), or RabbitMQ's
    `rabbitmq_url` (`topics` is then the one queue consumed: relay.inbox.rabbitmq)."""

    topics: tuple[str, ...]
    group_id: str
    bootstrap_servers: str  # Kafka ("" with nats_servers or rabbitmq_url)
    batch_max_events: int = 500  # messages per MongoDB transaction, at most
    batch_max_ms: int = 200  # how long a batch gathers after its first message, at most
    poll_timeout_s: float = 0.5  # longest wait in one poll: how quickly stop() is noticed when idle
    on_poison: str = "stop"  # `stop` or `dead-letter`, as RELAY_ON_POISON
    dead_letter_topic: str = "outbox.deadletter"  # as RELAY_DEAD_LETTER_TOPIC
    auto_offset_reset: str = "earliest"  # where a group without committed offsets starts
    schema_registry_url: str = ""  # the Confluent wire format's registry ("" : single-object only)
    # USER:PASSWORD for the registry's basic auth, as RELAY_SCHEMA_REGISTRY_BASIC_AUTH ("" : none)
    schema_registry_basic_auth: str = field(default="", repr=False)
    retry_backoff_max_s: float = 10.0  # the longest wait before a batch whose transaction failed is retried
    kafka: Mapping[str, str] = field(default_factory=dict)  # more librdkafka settings for both clients
    # NATS JetStream instead of Kafka (docs/nats.md, "Consumers"): the servers, the stream, the
    # credentials (as RELAY_NATS_*), how long a delivered batch waits for its acknowledgement
    # before JetStream delivers it again, and how long opening waits for the servers.
    nats_servers: str = ""
    nats_stream: str = "OUTBOX"
    nats_user: str = ""
    nats_password: str = field(default="", repr=False)
    nats_token: str = field(default="", repr=False)
    nats_creds: str = ""
    nats_tls_ca: str = ""
    ack_wait_s: float = 30.0
    connect_timeout_s: float = 30.0
    # RabbitMQ instead of Kafka (docs/rabbitmq.md, "Consumers"): the server's amqp:// or amqps://
    # URL (a secret, shown masked), the exchange the relay publishes to (where dead letters go, and
    # what `rabbitmq_bindings` bind to), the CA for amqps://, and the routing keys with which the
    # inbox declares its queue when missing and binds it (empty: the queue must exist).
    rabbitmq_url: str = ""
    rabbitmq_exchange: str = "outbox"
    rabbitmq_tls_ca: str = ""
    rabbitmq_bindings: tuple[str, ...] = ()

    @property
    def broker(self) -> str:
        """`nats` when `nats_servers` is given, `rabbitmq` with `rabbitmq_url`, else `kafka`."""
        if self.nats_servers:
            return "nats"
        return "rabbitmq" if self.rabbitmq_url else "kafka"

    def __repr__(self) -> str:
        """Every option, credentials as the relay shows them: `***`, a URL's user info `user:***@`."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        return f"RunOptions({', '.join(f'{k}={v!r}' for k, v in redact_mapping(shown).items())})"

    def __post_init__(self) -> None:
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ConfigError("topics", f"must be a non-empty list of topic names, got {self.topics!r}")
        if not self.group_id:
            raise ConfigError("group_id", "must be set")
        if sum(bool(s) for s in (self.bootstrap_servers, self.nats_servers, self.rabbitmq_url)) != 1:
            raise ConfigError(
                "bootstrap_servers",
                "give Kafka's bootstrap_servers, NATS's nats_servers or RabbitMQ's rabbitmq_url (one of them)",
            )
        register_secrets([s for s in (self.nats_password, self.nats_token) if s] + uri_secrets(self.nats_servers))
        register_secrets(uri_secrets(self.rabbitmq_url))
        self._check_rabbitmq()
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                positive(value, f.name)
        if self.on_poison not in POISON_POLICIES:
            raise ConfigError("on_poison", f"must be one of {', '.join(POISON_POLICIES)}; got {self.on_poison!r}")
        if self.schema_registry_basic_auth and ":" not in self.schema_registry_basic_auth:
            raise ConfigError("schema_registry_basic_auth", "must be USER:PASSWORD")
        # Credentials are masked in everything the relay's formatter and commands print.
        auth = self.schema_registry_basic_auth
        register_secrets([auth, auth.partition(":")[2], *uri_secrets(self.schema_registry_url)])
        register_secrets(v for k, v in self.kafka.items() for v in credential_values(k, str(v)))
        for key in self.kafka:
            if key in FORCED_CONSUMER_SETTINGS or key in ("group.id", "bootstrap.servers"):
                raise ConfigError(f"kafka[{key!r}]", "is set by the inbox (or by its own option); remove it")

    def _check_rabbitmq(self) -> None:
        """On RabbitMQ `topics` is one queue, and `rabbitmq_bindings` a list of routing keys."""
        if isinstance(self.rabbitmq_bindings, str) or not all(isinstance(b, str) and b for b in self.rabbitmq_bindings):
            raise ConfigError("rabbitmq_bindings", f"must be a list of routing keys, got {self.rabbitmq_bindings!r}")
        object.__setattr__(self, "rabbitmq_bindings", tuple(self.rabbitmq_bindings))
        if self.rabbitmq_url and len(self.topics) != 1:
            raise ConfigError(
                "topics", f"on RabbitMQ, topics is the one queue the inbox consumes, got {', '.join(self.topics)}"
            )
        if self.rabbitmq_url:
            self.rabbitmq_config()

    def rabbitmq_config(self) -> RabbitConfig:
        """The connection settings of the `rabbitmq_*` options (the relay's RabbitConfig, so its
        checks, each failure naming the option)."""
        try:
            return RabbitConfig(
                url=Uri(self.rabbitmq_url),
                exchange=self.rabbitmq_exchange,
                tls_ca=self.rabbitmq_tls_ca,
                confirm_timeout_ms=RABBITMQ_CONFIRM_TIMEOUT_MS,
                connect_timeout_s=self.connect_timeout_s,
                delivery=AT_LEAST_ONCE,
            )
        except ConfigError as exc:
            option = exc.setting.removeprefix("RELAY_").lower()
            raise ConfigError(option, str(exc).partition(": ")[2]) from exc

    @classmethod
    def of(cls, topics: Any, group_id: str, bootstrap_servers: str | None, options: Mapping[str, Any]) -> RunOptions:
        """The options of one `run` call; an unknown option raises ConfigError naming it."""
        known = {f.name for f in fields(cls)} - {"topics", "group_id", "bootstrap_servers"}
        for name in options:
            if name not in known:
                raise ConfigError(name, f"is not an option of Inbox.run (known: {', '.join(sorted(known))})")
        names = (topics,) if isinstance(topics, str) else tuple(topics)
        return cls(names, group_id, bootstrap_servers or "", **options)

    def consumer_config(self) -> dict[str, str]:
        """The consumer's librdkafka configuration."""
        return {
            **CONSUMER_DEFAULTS,
            **{k: str(v) for k, v in self.kafka.items()},
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "auto.offset.reset": self.auto_offset_reset,
            **FORCED_CONSUMER_SETTINGS,
        }

    def producer_config(self) -> dict[str, str]:
        """The dead-letter producer's configuration: idempotent, acks=all."""
        consumer_only = ("session.", "max.poll", "fetch.", "statistics.")
        plain = {k: str(v) for k, v in self.kafka.items() if not k.startswith(consumer_only)}
        return {**plain, "bootstrap.servers": self.bootstrap_servers, "enable.idempotence": "true", "acks": "all"}

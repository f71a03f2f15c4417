"""`Inbox.run`'s options: one frozen object, every field with its default, checked once at start.

Unknown options and librdkafka settings the inbox owns raise `ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from relay.core.config import POISON_POLICIES, positive
from relay.core.errors import ConfigError
from relay.core.redact import credential_values, redact_mapping, register_secrets, uri_secrets

# librdkafka settings with the inbox's own defaults (`kafka` may change them): librdkafka's
# statistics carry each assigned partition's lag (relay_inbox_lag_messages), refreshed this often;
# "0" turns them, and the lag series, off.
CONSUMER_DEFAULTS = {"statistics.interval.ms": "5000"}

# librdkafka settings the guarantee rests on: set by the inbox, refused in `kafka`.
FORCED_CONSUMER_SETTINGS = {
    "isolation.level": "read_committed",  # messages of aborted Kafka transactions are never seen
    "enable.auto.commit": "false",  # offsets are committed only after the MongoDB transaction
    "enable.auto.offset.store": "false",
}


@dataclass(frozen=True)
class RunOptions:
    """What `Inbox.run(handler, *, topics, group_id, bootstrap_servers, **options)` takes: Kafka's
    `bootstrap_servers`, or NATS JetStream's `nats_servers` (`topics` are then subjects of
    `nats_stream`, `group_id` the durable consumer: relay.inbox.jetstream)."""

    topics: tuple[str, ...]
    group_id: str
    bootstrap_servers: str  # Kafka ("" with nats_servers)
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

    @property
    def broker(self) -> str:
        """`nats` when `nats_servers` is given, else `kafka`."""
        return "nats" if self.nats_servers else "kafka"

    def __repr__(self) -> str:
        """Every option, credentials as the relay shows them: `***`, a URL's user info `user:***@`."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        return f"RunOptions({', '.join(f'{k}={v!r}' for k, v in redact_mapping(shown).items())})"

    def __post_init__(self) -> None:
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ConfigError("topics", f"must be a non-empty list of topic names, got {self.topics!r}")
        if not self.group_id:
            raise ConfigError("group_id", "must be set")
        if bool(self.bootstrap_servers) == bool(self.nats_servers):
            raise ConfigError(
                "bootstrap_servers", "give Kafka's bootstrap_servers or NATS's nats_servers (one of them)"
            )
        register_secrets([s for s in (self.nats_password, self.nats_token) if s] + uri_secrets(self.nats_servers))
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

"""What the Kafka side takes from the settings, checked where it is used.

Kafka client properties pass through (`RELAY_KAFKA_COMPRESSION_TYPE=zstd` sets
`compression.type`). The producer gets the relay's defaults, then the user's properties, then
the properties the guarantees depend on (idempotence, acks=all), which are forced and refused if
contradicted. The relay's other clients (reachability checks, the offsets topic, `tail`) get the
user's properties that any client takes (security, client id), without the producer-only ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.core.config import DELIVERY_MODES, EXACTLY_ONCE, positive
from relay.core.errors import ConfigError
from relay.core.message import valid_topic
from relay.core.names import env_name, kafka_env_name
from relay.core.redact import Properties, Uri, hold_masked

# Producer properties the relay's guarantees depend on: forced, and refused if contradicted.
# Gapless: a record batch the broker refuses for good stops the producer instead of letting
# librdkafka bump the epoch and send what was queued behind it (docs/faults.md, "Delivery errors").
FORCED: dict[str, str] = {"enable.idempotence": "true", "acks": "all", "enable.gapless.guarantee": "true"}
_EQUIVALENT = {"acks": {"all", "-1"}, "enable.idempotence": {"true"}, "enable.gapless.guarantee": {"true"}}
# Defaults for the producer that users may override.
DEFAULTS: dict[str, str] = {
    "linger.ms": "5",
    "compression.type": "lz4",
    "message.timeout.ms": "120000",
    "message.max.bytes": "1000000",
}
# Producer-only properties the relay's settings may carry; a consumer would warn about them.
PRODUCER_ONLY = frozenset(
    {
        "acks",
        "request.required.acks",
        "enable.idempotence",
        "linger.ms",
        "queue.buffering.max.ms",
        "compression.type",
        "compression.codec",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "batch.size",
        "batch.num.messages",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "retries",
        "message.send.max.retries",
        "retry.backoff.ms",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
        "transactional.id",
        "partitioner",
        "sticky.partitioning.linger.ms",
        "enable.gapless.guarantee",
        "transaction.timeout.ms",
    }
)


@dataclass(frozen=True, kw_only=True)
class KafkaConfig:
    """The broker, the user's client properties, and the delivery mode (RELAY_KAFKA_*,
    RELAY_DELIVERY, RELAY_OFFSETS_TOPIC). The servers and the properties render masked (`Uri`,
    `Properties`); `producer_config()` and `client_config()` give the clear values, for
    librdkafka only."""

    bootstrap_servers: Uri
    properties: Properties  # RELAY_KAFKA_<PROPERTY>, as given
    connect_timeout_s: float
    delivery: str
    offsets_topic: str
    # Exactly-once: a transaction spans reads until one bound is reached (relay.kafka.transactions).
    transaction_max_events: int
    transaction_max_bytes: int
    transaction_max_ms: int

    def __post_init__(self) -> None:
        hold_masked(self, uris=["bootstrap_servers"], properties=["properties"])
        for name in ("transaction_max_events", "transaction_max_bytes", "transaction_max_ms"):
            positive(getattr(self, name), env_name(name))
        if not self.bootstrap_servers.reveal().strip():
            raise ConfigError(env_name("kafka_bootstrap_servers"), "must not be empty")
        for key, forced in FORCED.items():
            given = self.properties.get(key)
            if given is not None and given.lower() not in _EQUIVALENT[key]:
                raise ConfigError(
                    kafka_env_name(key), f"must be {forced}: the relay's ordering and no-loss guarantees need it"
                )
        mmb = self.producer_config()["message.max.bytes"]
        if not mmb.strip().isdigit():
            raise ConfigError(kafka_env_name("message.max.bytes"), f"must be an integer, got {mmb!r}")
        if int(mmb) < 1000:
            raise ConfigError(kafka_env_name("message.max.bytes"), "must be at least 1000")
        if self.delivery not in DELIVERY_MODES:
            raise ConfigError(
                env_name("delivery"), f"must be one of {', '.join(DELIVERY_MODES)}; got {self.delivery!r}"
            )
        if not valid_topic(self.offsets_topic):
            raise ConfigError(env_name("offsets_topic"), f"not a valid Kafka topic name: {self.offsets_topic!r}")
        if "transactional.id" in self.properties:
            raise ConfigError(
                kafka_env_name("transactional.id"),
                "set by the relay (outbox-relay:<lease id>) in RELAY_DELIVERY=exactly-once; remove it",
            )
        message_timeout = self.producer_config()["message.timeout.ms"]
        timeouts = {
            "message.timeout.ms": message_timeout,
            "transaction.timeout.ms": self.properties.get("transaction.timeout.ms"),
        }
        for prop, value in timeouts.items():
            if value is not None and not value.strip().isdigit():
                raise ConfigError(kafka_env_name(prop), f"must be an integer, got {value!r}")
        given = timeouts["transaction.timeout.ms"]
        if self.exactly_once and given is not None and int(given) < int(message_timeout):
            raise ConfigError(
                kafka_env_name("transaction.timeout.ms"),
                f"must be at least message.timeout.ms ({message_timeout}): "
                "librdkafka refuses a delivery timeout longer than the transaction's",
            )

        if self.exactly_once and self.transaction_max_ms >= self.transaction_timeout_ms:
            raise ConfigError(
                env_name("transaction_max_ms"),
                f"must be less than the transaction timeout ({self.transaction_timeout_ms} ms, "
                "RELAY_KAFKA_TRANSACTION_TIMEOUT_MS): the broker aborts a transaction open longer",
            )

    @property
    def exactly_once(self) -> bool:
        return self.delivery == EXACTLY_ONCE

    def producer_config(self) -> dict[str, str]:
        """The producer configuration: defaults, then user properties, then the forced ones."""
        return {**DEFAULTS, **self.properties, **FORCED, "bootstrap.servers": self.bootstrap_servers.reveal()}

    def client_config(self) -> dict[str, str]:
        """For the relay's other Kafka clients: the user's properties that any client takes."""
        return {
            **{k: v for k, v in self.properties.items() if k not in PRODUCER_ONLY},
            "bootstrap.servers": self.bootstrap_servers.reveal(),
        }

    @property
    def max_message_bytes(self) -> int:
        return int(self.producer_config()["message.max.bytes"])

    @property
    def transaction_timeout_ms(self) -> int:
        """The producer's `transaction.timeout.ms` in exactly-once mode: the user's, else
        `message.timeout.ms` (librdkafka needs message.timeout.ms <= transaction.timeout.ms)."""
        return int(self.properties.get("transaction.timeout.ms", self.producer_config()["message.timeout.ms"]))

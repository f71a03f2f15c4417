"""The names users see for settings: each setting's environment variable (RELAY_<NAME>), and each
Kafka client property's (RELAY_KAFKA_<PROPERTY>). Errors about a setting name it this way."""

from __future__ import annotations

ENV_PREFIX = "RELAY_"
KAFKA_ENV_PREFIX = "RELAY_KAFKA_"


def env_name(name: str) -> str:
    """The environment variable of a setting: `batch_max_events` -> RELAY_BATCH_MAX_EVENTS."""
    return ENV_PREFIX + name.upper()


def kafka_env_name(prop: str) -> str:
    """The environment variable of a Kafka client property: `linger.ms` -> RELAY_KAFKA_LINGER_MS."""
    return KAFKA_ENV_PREFIX + prop.upper().replace(".", "_")

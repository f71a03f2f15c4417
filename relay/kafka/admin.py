"""Kafka reachability, checked at start: one short line naming the setting to look at."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from relay.core.errors import ServerUnreachableError, env_name
from relay.kafka.config import KafkaConfig


def client_config(config: KafkaConfig, logger: str) -> dict[str, Any]:
    """The configuration of one of the relay's Kafka clients besides the producer, its
    librdkafka log lines through the `logger` logger."""
    return {**config.client_config(), "logger": logging.getLogger(logger)}


def check_kafka(config: KafkaConfig) -> None:
    """Return once a Kafka broker answers a metadata request; else ServerUnreachableError."""
    admin = AdminClient({**client_config(config, "kafka.admin"), "log_level": 0})
    cause: KafkaException | None = None
    try:
        if admin.list_topics(timeout=config.connect_timeout_s).brokers:
            return
    except KafkaException as exc:
        cause = exc
    raise ServerUnreachableError(
        f"cannot reach Kafka at {config.bootstrap_servers} within {config.connect_timeout_s:g}s "
        f"({env_name('kafka_bootstrap_servers')})"
    ) from cause

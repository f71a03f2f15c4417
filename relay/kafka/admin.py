"""Kafka reachability, checked at start: one short line naming the setting to look at."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from relay.core.errors import ServerUnreachableError, env_name
from relay.kafka.config import KafkaConfig


def check_kafka(config: KafkaConfig) -> None:
    """Return once a Kafka broker answers a metadata request; else ServerUnreachableError."""
    admin = AdminClient({**config.client_config(), "log_level": 0, "logger": logging.getLogger("kafka.admin")})
    cause: KafkaException | None = None
    try:
        if admin.list_topics(timeout=config.connect_timeout_s).brokers:
            return
    except KafkaException as exc:
        cause = exc
    raise ServerUnreachableError(
        f"cannot reach Kafka at {config.bootstrap_servers} within {config.connect_timeout_s:g}s "
        f"({env_name('kafka_bootstrap_servers')})") from cause

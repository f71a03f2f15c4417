"""Kafka reachability, checked at start: one short line naming the setting to look at."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from relay.core.errors import ServerUnreachableError
from relay.core.names import env_name
from relay.core.retry import said_while_waiting, waiting_line
from relay.kafka.config import KafkaConfig


def client_config(config: KafkaConfig, logger: str) -> dict[str, Any]:
    """The configuration of one of the relay's Kafka clients besides the producer, its
    librdkafka log lines through the `logger` logger."""
    return {**config.client_config(), "logger": logging.getLogger(logger)}


def check_kafka(config: KafkaConfig) -> None:
    """Return once a Kafka broker answers a metadata request; else ServerUnreachableError,
    naming what librdkafka last reported (a refused TLS certificate or host name, failed SASL
    authentication), which points at the RELAY_KAFKA_SSL_* / SASL_* settings to look at. A broker
    that does not answer within a second gets one WARNING line at once, naming what is awaited and
    for how long (relay.core.retry.said_while_waiting); then the wait goes on."""
    reported: list[KafkaError] = []
    conf: dict[str, Any] = {**client_config(config, "kafka.admin"), "log_level": 0, "error_cb": reported.append}
    admin = AdminClient(conf)

    def metadata(seconds: float) -> None:
        if not admin.list_topics(timeout=seconds).brokers:
            raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "no broker in the metadata"))

    cause: KafkaException | None = None
    try:
        timeout = config.connect_timeout_s
        waiting = waiting_line("Kafka", config.bootstrap_servers, "kafka_bootstrap_servers", timeout)
        said_while_waiting(metadata, timeout, lambda exc: isinstance(exc, KafkaException), waiting)
        return
    except KafkaException as exc:
        cause = exc
    admin.poll(0)  # serves error_cb: what librdkafka reported while trying
    causes = [e for e in reported if e.code() != KafkaError._ALL_BROKERS_DOWN] or reported
    why = f": {causes[-1].str()}" if causes else ""
    raise ServerUnreachableError(
        f"cannot reach Kafka at {config.bootstrap_servers} within {config.connect_timeout_s:g}s "
        f"({env_name('kafka_bootstrap_servers')}){why}"
    ) from cause

"""Connections to the servers: the relay's MongoDB client and the start-up reachability checks.

Each check turns "cannot connect" into one short line that names the setting to look at:
`ServerUnreachableError` (exit 3) when nothing answers in time, `ConfigError` (exit 2) when a
server answers but is not what the settings promise (a MongoDB that is not a replica set).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.server_api import ServerApi

from relay.config import Settings, env_name
from relay.errors import ConfigError, ServerUnreachableError

_TIMEOUTS = re.compile(r" \(configured timeouts: [^)]*\)")


def mongo_client(settings: Settings, **kw: Any) -> MongoClient[Any]:
    """The relay's MongoDB client: Stable API v1, bounded server selection and socket waits."""
    # A socket timeout bounds every operation, so a frozen server turns into a restart (and
    # an unready relay) instead of a loop stuck forever in one getMore.
    return MongoClient(settings.mongodb_uri, server_api=ServerApi("1"), appname="outbox-relay",
                       serverSelectionTimeoutMS=int(settings.connect_timeout_s * 1000),
                       socketTimeoutMS=int(max(settings.connect_timeout_s, 10.0) * 1000),
                       tz_aware=True, **kw)


def mongo_cause(exc: PyMongoError) -> str:
    """pymongo's message without the topology description it appends to selection timeouts.

    A server selection timeout reads "<host>: <cause> (configured timeouts: ...), Timeout: 30s,
    Topology Description: <...>": the cause per host is kept whole, the timeouts (the caller
    names its own) and the topology description are dropped.
    """
    head = str(exc).partition(", Timeout: ")[0]
    return _TIMEOUTS.sub("", head).strip()


def check_mongodb(client: MongoClient[Any], settings: Settings) -> None:
    """Return once MongoDB answers and is a replica set member.

    Raises ServerUnreachableError when nothing answers within RELAY_CONNECT_TIMEOUT_S, and
    ConfigError naming RELAY_MONGODB_URI when the server answers but is not a replica set
    member (change streams need one).
    """
    try:
        hello = client.admin.command("hello")
    except PyMongoError as exc:
        raise ServerUnreachableError(
            f"cannot reach MongoDB at {settings.mongodb_uri} within {settings.connect_timeout_s:g}s "
            f"({env_name('mongodb_uri')}): {mongo_cause(exc)}") from None
    if "setName" not in hello:
        raise ConfigError(env_name("mongodb_uri"),
                          f"MongoDB at {settings.mongodb_uri} answers but is not a replica set member; "
                          "change streams need one (start mongod with --replSet and initiate it)")


def check_kafka(settings: Settings) -> None:
    """Return once a Kafka broker answers a metadata request; else ServerUnreachableError."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**settings.kafka_client_config(), "log_level": 0,
                         "logger": logging.getLogger("kafka.admin")})
    try:
        if admin.list_topics(timeout=settings.connect_timeout_s).brokers:
            return
    except KafkaException:
        pass
    raise ServerUnreachableError(
        f"cannot reach Kafka at {settings.kafka_bootstrap_servers} within "
        f"{settings.connect_timeout_s:g}s ({env_name('kafka_bootstrap_servers')})")

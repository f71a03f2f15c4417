"""The relay's MongoDB client, and the start-up reachability check.

The check turns "cannot connect" into one short line that names the setting to look at:
`ServerUnreachableError` (exit 3) when nothing answers in time, `ConfigError` (exit 2) when the
server answers but is not what the settings promise (a MongoDB that is not a replica set).
"""

from __future__ import annotations

import re
from typing import Any

import pymongo
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.server_api import ServerApi

from relay.core.errors import ConfigError, ServerUnreachableError
from relay.core.names import env_name
from relay.core.retry import said_while_waiting, waiting_line
from relay.mongo.commands import CommandNames
from relay.mongo.config import URI_ERRORS, MongoConfig, uri_error
from relay.mongo.errors import AUTHENTICATION_FAILED

_TIMEOUTS = re.compile(r" \(configured timeouts: [^)]*\)")


def mongo_client(config: MongoConfig, **kw: Any) -> MongoClient[Any]:
    """The relay's MongoDB client: Stable API v1, bounded server selection and socket waits.
    Its command listener names a failed command for the error's line (relay.mongo.commands).
    A URI the client refuses (a mongodb+srv:// one is checked only here) is a ConfigError naming
    RELAY_MONGODB_URI."""
    # A socket timeout bounds every operation, so a frozen server turns into a restart (and
    # an unready relay) instead of a loop stuck forever in one getMore.
    uri = config.uri.reveal()
    try:
        return MongoClient(
            uri,
            server_api=ServerApi("1"),
            appname="outbox-relay",
            serverSelectionTimeoutMS=int(config.connect_timeout_s * 1000),
            socketTimeoutMS=int(max(config.connect_timeout_s, 10.0) * 1000),
            tz_aware=True,
            **{"event_listeners": [CommandNames()], **kw},
        )
    except URI_ERRORS as exc:
        raise uri_error(uri, exc) from exc


def mongo_cause(exc: PyMongoError) -> str:
    """pymongo's message without the topology description it appends to selection timeouts.

    A server selection timeout reads "<host>: <cause> (configured timeouts: ...), Timeout: 30s,
    Topology Description: <...>": the cause per host is kept whole, the timeouts (the caller
    names its own) and the topology description are dropped.
    """
    head = str(exc).partition(", Timeout: ")[0]
    return _TIMEOUTS.sub("", head).strip()


def check_mongodb(client: MongoClient[Any], config: MongoConfig) -> None:
    """Return once MongoDB answers and is a replica set member.

    A MongoDB that does not answer within a second gets one WARNING line at once, naming what is
    awaited and for how long (relay.core.retry.said_while_waiting); then the wait goes on.
    Raises ServerUnreachableError when nothing answers within RELAY_CONNECT_TIMEOUT_S, and
    ConfigError naming RELAY_MONGODB_URI when the server refuses the credentials or answers but
    is not a replica set member (change streams need one). The URI shows no password (a `Uri`).
    """

    def hello(seconds: float) -> dict[str, Any]:
        with pymongo.timeout(seconds):
            return client.admin.command("hello")

    timeout = config.connect_timeout_s
    try:
        reply = said_while_waiting(
            hello, timeout, _not_answering, waiting_line("MongoDB", config.uri, "mongodb_uri", timeout)
        )
    except OperationFailure as exc:
        if exc.code != AUTHENTICATION_FAILED:
            raise
        raise ConfigError(
            env_name("mongodb_uri"),
            f"MongoDB at {config.uri} refused the credentials (AuthenticationFailed, code 18): "
            "check the user, its password and authSource",
        ) from exc
    except PyMongoError as exc:
        raise ServerUnreachableError(
            f"cannot reach MongoDB at {config.uri} within {config.connect_timeout_s:g}s "
            f"({env_name('mongodb_uri')}): {mongo_cause(exc)}"
        ) from exc
    if "setName" not in reply:
        raise ConfigError(
            env_name("mongodb_uri"),
            f"MongoDB at {config.uri} answers but is not a replica set member; "
            "change streams need one (start mongod with --replSet and initiate it)",
        )


def _not_answering(exc: BaseException) -> bool:
    """No answer yet (a refused connection, a selection timeout), not a refusal the server sent."""
    return isinstance(exc, PyMongoError) and not isinstance(exc, OperationFailure)

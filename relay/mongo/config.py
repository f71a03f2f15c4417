"""What the MongoDB side takes from the settings, checked where it is used."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.errors import ConfigurationError, InvalidURI
from pymongo.uri_parser import parse_uri, parse_userinfo, split_options

from relay.core.config import positive
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.core.redact import MASK, Uri, hold_masked, secret_name, uri_secrets

SRV_SCHEME = "mongodb+srv://"
# What pymongo's URI parser raises for a URI it refuses (a file option it cannot open: OSError).
URI_ERRORS = (InvalidURI, ConfigurationError, ValueError, OSError)


def _user_info(uri: str) -> str:
    """The user info of a MongoDB URI as written, split as pymongo splits it: before the last `@`
    of the part between the scheme and the first `/` or `?`."""
    host_part = uri.partition("://")[2].partition("?")[0].partition("/")[0]
    return host_part.rpartition("@")[0]


def parse_mongodb_uri(uri: str) -> tuple[str | None, Mapping[str, Any]]:
    """The password and the options of a MongoDB URI as pymongo reads them (the public
    `pymongo.uri_parser`), or what pymongo raises for it (URI_ERRORS). A mongodb:// URI is parsed
    whole by `parse_uri`, as the client would (unknown options warned about, not refused); of a
    mongodb+srv:// URI only the user info and the options are (`parse_userinfo`,
    `split_options`): `parse_uri` would look its host up in DNS, which the client does when it
    connects."""
    if not uri.startswith(SRV_SCHEME):
        parsed = parse_uri(uri, warn=True)
        return parsed["password"], parsed["options"]
    info, query = _user_info(uri), uri.partition("?")[2]
    password = parse_userinfo(info)[1] if info else None
    return password, split_options(query, warn=True) if query else {}


def uri_credentials(uri: str) -> list[str]:
    """The credentials a MongoDB URI carries, as written and as pymongo decodes them: the password
    of its user info and the values of its password-like options (`tlsCertificateKeyFilePassword`,
    `authMechanismProperties`), for `relay.core.redact.register_secrets`. A URI pymongo refuses
    still yields what its user info holds after the first `:`."""
    written = _user_info(uri).partition(":")[2]
    found = [written, unquote_plus(written), *uri_secrets(uri)]  # and the options as written
    try:
        password, options = parse_mongodb_uri(uri)
    except URI_ERRORS:
        return found
    found.append(password or "")
    for name, value in options.items():
        if secret_name(name):
            found += [str(v) for v in value.values()] if isinstance(value, Mapping) else [str(value)]
    return found


def check_uri(uri: str) -> None:
    """ConfigError naming RELAY_MONGODB_URI when pymongo refuses the URI (its reason, without the
    URI's password)."""
    if not uri.startswith(("mongodb://", SRV_SCHEME)):
        raise ConfigError(env_name("mongodb_uri"), "must start with mongodb:// or mongodb+srv://")
    try:
        parse_mongodb_uri(uri)
    except URI_ERRORS as exc:
        raise uri_error(uri, exc) from exc


def uri_error(uri: str, exc: BaseException) -> ConfigError:
    """The ConfigError for pymongo's refusal `exc` of `uri`: its reason, with what the URI's user
    info and options hold masked (pymongo may quote the host part, user info included)."""
    reason = str(exc)
    for value in sorted(uri_credentials(uri), key=len, reverse=True):
        if value:
            reason = reason.replace(value, MASK)
    return ConfigError(env_name("mongodb_uri"), f"pymongo refuses the URI ({type(exc).__name__}): {reason}")


@dataclass(frozen=True, kw_only=True)
class MongoConfig:
    """Where the outbox and the lease documents live, and how long to wait for the server. The
    URI is a `Uri`: shown without its password; `uri.reveal()` is for the client only."""

    uri: Uri
    database: str  # holds the relay's own state: the lease collection and its _replicas
    change_streams: str  # CHANGE_STREAMS: one per database holding outboxes, or one for the cluster
    lease_collection: str
    connect_timeout_s: float
    max_await_ms: int  # the longest a getMore waits for new changes
    read_linger_ms: int  # caught up, the least time from a read with events to the next read

    def __post_init__(self) -> None:
        hold_masked(self, uris=["uri"])
        check_uri(self.uri.reveal())
        for name in ("database", "lease_collection"):
            if not getattr(self, name).strip():
                raise ConfigError(env_name(name), "must not be empty")
        if self.change_streams not in CHANGE_STREAMS:
            raise ConfigError(
                env_name("change_streams"), f"must be one of {', '.join(CHANGE_STREAMS)}; got {self.change_streams!r}"
            )
        for name in ("connect_timeout_s", "max_await_ms"):
            positive(getattr(self, name), env_name(name))
        if self.read_linger_ms < 0:
            raise ConfigError(env_name("read_linger_ms"), f"must be 0 or more, got {self.read_linger_ms}")

    def leases(self, client: MongoClient[Any]) -> Collection[Any]:
        """The collection of the lease documents (in the state database)."""
        return client[self.database][self.lease_collection]

    def outbox(self, client: MongoClient[Any], namespace: Namespace) -> Collection[Any]:
        """The outbox collection `namespace`."""
        return client[namespace.database][namespace.collection]


PER_DATABASE, CLUSTER = "per-database", "cluster"
CHANGE_STREAMS = (PER_DATABASE, CLUSTER)  # RELAY_CHANGE_STREAMS

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(setting: str, value: str) -> float | None:
    """`RELAY_OUTBOX_RETENTION`'s form: seconds, or a number with s, m, h or d; empty or `off`
    turns clean-up off (None)."""
    if value.strip().lower() in ("", "off"):
        return None
    match = _DURATION.match(value.lower())
    if match is None:
        raise ConfigError(
            env_name(setting), f"expected a duration such as 3600, 90m, 24h or 7d (or off), got {value!r}"
        )
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


@dataclass(frozen=True, kw_only=True)
class OutboxCleanupConfig:
    """What clean-up and the outbox checks take from the settings."""

    retention: str  # RELAY_OUTBOX_RETENTION: off by default
    check_interval_s: float  # RELAY_OUTBOX_CHECK_INTERVAL_S
    ttl_headroom_warn_s: float  # RELAY_TTL_HEADROOM_WARN_S
    batch: int = 500  # documents per delete
    pass_budget_s: float = 2.0  # longest one pass deletes before yielding

    def __post_init__(self) -> None:
        self.retention_s  # noqa: B018 - parses, and names the setting on error
        positive(self.check_interval_s, env_name("outbox_check_interval_s"))
        if self.ttl_headroom_warn_s < 0:
            raise ConfigError(env_name("ttl_headroom_warn_s"), f"must be 0 or more, got {self.ttl_headroom_warn_s}")

    @property
    def retention_s(self) -> float | None:
        return parse_duration("outbox_retention", self.retention)

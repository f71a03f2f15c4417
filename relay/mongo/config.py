"""What the MongoDB side takes from the settings, checked where it is used."""

from __future__ import annotations

import re
from dataclasses import dataclass

from relay.core.errors import ConfigError, env_name


@dataclass(frozen=True, kw_only=True)
class MongoConfig:
    """Where the outbox and the lease documents live, and how long to wait for the server."""

    uri: str
    database: str
    outbox_collection: str
    lease_collection: str
    connect_timeout_s: float
    max_await_ms: int  # the longest a getMore waits for new changes

    def __post_init__(self) -> None:
        if not self.uri.startswith(("mongodb://", "mongodb+srv://")):
            raise ConfigError(env_name("mongodb_uri"), "must start with mongodb:// or mongodb+srv://")
        for name in ("database", "outbox_collection", "lease_collection"):
            if not getattr(self, name).strip():
                raise ConfigError(env_name(name), "must not be empty")
        for name in ("connect_timeout_s", "max_await_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(env_name(name), f"must be greater than 0, got {getattr(self, name)}")

    @property
    def namespace(self) -> str:
        return f"{self.database}.{self.outbox_collection}"


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
        for name in ("check_interval_s",):
            if getattr(self, name) <= 0:
                raise ConfigError(env_name(f"outbox_{name}"), f"must be greater than 0, got {getattr(self, name)}")
        if self.ttl_headroom_warn_s < 0:
            raise ConfigError(env_name("ttl_headroom_warn_s"), f"must be 0 or more, got {self.ttl_headroom_warn_s}")

    @property
    def retention_s(self) -> float | None:
        return parse_duration("outbox_retention", self.retention)

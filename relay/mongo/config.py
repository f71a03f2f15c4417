"""What the MongoDB side takes from the settings, checked where it is used."""

from __future__ import annotations

from dataclasses import dataclass

from relay.core.errors import ConfigError, env_name


@dataclass(frozen=True)
class MongoConfig:
    """Where the outbox and the lease documents live, and how long to wait for the server."""

    uri: str = "mongodb://localhost:27017/?replicaSet=rs0"
    database: str = "app"
    outbox_collection: str = "outbox"
    lease_collection: str = "outbox_relay_leases"
    connect_timeout_s: float = 30.0
    max_await_ms: int = 500  # the longest a getMore waits for new changes

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

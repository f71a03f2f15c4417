"""What the observer, the health checks and the logs take from the settings."""

from __future__ import annotations

from dataclasses import dataclass

from relay.core.config import LeaseTiming
from relay.core.errors import ConfigError
from relay.core.names import env_name

LOG_FORMATS = ("auto", "json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True, kw_only=True)
class HealthConfig:
    """The waits the health thresholds are derived from (relay.ops.health.Health)."""

    connect_timeout_s: float
    restart_backoff_max_s: float
    timing: LeaseTiming
    max_await_ms: int

    @property
    def live_stall_s(self) -> float:
        """/livez fails when the loop has not turned for this long: longer than any wait the loop
        makes while healthy or on a slow server (three MongoDB socket timeouts, the longest restart
        backoff and a standby poll; at least 60 s), so only a loop that is stuck fails it."""
        io_timeout_s = max(self.connect_timeout_s, 10.0)  # relay.mongo.connection's socket timeout
        return max(60.0, 3 * io_timeout_s + self.restart_backoff_max_s + self.timing.standby_poll_s)

    @property
    def ready_stall_s(self) -> float:
        """/readyz fails when the loop has not turned for this long (a blocked getMore or write:
        MongoDB unreachable)."""
        return 10.0 + 2 * max(self.max_await_ms / 1000.0, self.timing.standby_poll_s)


@dataclass(frozen=True, kw_only=True)
class ObserverConfig:
    """Who this relay is, where it serves its metrics and health, and its health thresholds."""

    instance_id: str
    http_port: int
    dead_letter_topic: str  # named in the dead-letter log lines
    partitions: int
    health: HealthConfig
    http_host: str  # the address the HTTP server binds (RELAY_HTTP_HOST)
    broker: str  # RELAY_BROKER: the `broker` label of the publishing series

    def __post_init__(self) -> None:
        if not self.http_host.strip():
            raise ConfigError(env_name("http_host"), "must not be empty (0.0.0.0: every interface)")
        if not self.instance_id.strip():
            raise ConfigError(env_name("instance_id"), "must not be empty")
        if not 0 <= self.http_port <= 65535:
            raise ConfigError(env_name("http_port"), f"not a port number: {self.http_port}")


def check_logging(level: str, fmt: str) -> None:
    """ConfigError naming RELAY_LOG_LEVEL or RELAY_LOG_FORMAT when the value is unknown."""
    if level.upper() not in LOG_LEVELS:
        raise ConfigError(env_name("log_level"), f"unknown level {level!r}")
    if fmt not in LOG_FORMATS:
        raise ConfigError(env_name("log_format"), f"must be one of {', '.join(LOG_FORMATS)}; got {fmt!r}")

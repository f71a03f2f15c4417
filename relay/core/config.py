"""What the loop takes from the settings, checked where it is used (each failure names the
RELAY_ setting; relay.config maps the settings onto this)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields

from relay.core.errors import ConfigError, env_name

STOP, DEAD_LETTER = "stop", "dead-letter"
POISON_POLICIES = (STOP, DEAD_LETTER)  # RELAY_ON_POISON (relay.core.poison)
HISTORY_LOST_POLICIES = ("stop", "rescan")
LEASE_LOST_POLICIES = ("standby", "exit")
AT_LEAST_ONCE, EXACTLY_ONCE = "at-least-once", "exactly-once"
DELIVERY_MODES = (AT_LEAST_ONCE, EXACTLY_ONCE)  # RELAY_DELIVERY (relay.kafka.modes)
START_KEYWORDS = ("oplog-start", "now")  # RELAY_START_AT values that are not a time

# How long one blocking wait (delivery reports, a Kafka transaction call, a poll) lasts at most,
# so the loop turns and the lease heartbeat runs between waits.
WAIT_SLICE_S = 0.5


def parse_start_time(text: str) -> dt.datetime:
    """RELAY_START_AT as a time (UTC when it names no zone); ConfigError if it is not ISO-8601."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(env_name("start_at"), f"must be oplog-start, now, or an ISO-8601 time; got {text!r}") from exc
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def start_at_time(start_at: str) -> dt.datetime | None:
    """The operator-given start time of RELAY_START_AT, or None for `oplog-start` / `now`."""
    return None if start_at in START_KEYWORDS else parse_start_time(start_at)


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """The loop's limits, timing and policies (relay.core.loop.Relay).

    Invariants checked here: every size and period is positive; the lease is renewed at least
    twice per TTL (`heartbeat_interval_s` <= `lease_ttl_s` / 2), so a healthy leader never loses
    it; the policies are ones the loop knows.
    """

    namespace: str  # what the loop's log lines name
    batch_max_events: int
    batch_max_bytes: int
    pipeline_depth: int
    lease_ttl_s: float
    heartbeat_interval_s: float
    standby_poll_s: float
    restart_backoff_max_s: float
    on_poison: str
    on_history_lost: str
    on_lease_lost: str
    start_at: str
    # RELAY_DELIVERY=exactly-once: the events one Kafka transaction may hold over several reads
    # (RELAY_TRANSACTION_MAX_EVENTS), which the window then holds until the commit; None otherwise.
    transaction_max_events: int | None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and value <= 0:
                raise ConfigError(env_name(f.name), f"must be greater than 0, got {value}")
        if self.heartbeat_interval_s * 2 > self.lease_ttl_s:
            raise ConfigError(
                env_name("heartbeat_interval_s"),
                f"must be at most half of RELAY_LEASE_TTL_S ({self.lease_ttl_s}) "
                "so the lease is renewed before it expires",
            )
        for name, allowed in (
            ("on_poison", POISON_POLICIES),
            ("on_history_lost", HISTORY_LOST_POLICIES),
            ("on_lease_lost", LEASE_LOST_POLICIES),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(env_name(name), f"must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        self.start_at_time()  # raises ConfigError

    def start_at_time(self) -> dt.datetime | None:
        """The operator-given start time, or None for `oplog-start` / `now`."""
        return start_at_time(self.start_at)

"""What the loop takes from the settings, checked where it is used (each failure names the
RELAY_ setting; relay.config builds these from the settings)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from relay.core.errors import ConfigError
from relay.core.names import env_name

STOP, DEAD_LETTER, SKIP = "stop", "dead-letter", "skip"
POISON_POLICIES = (STOP, DEAD_LETTER)  # RELAY_ON_POISON (relay.core.poison; SKIP is the replay's alone)
HISTORY_LOST_POLICIES = ("stop", "rescan")
LEASE_LOST_POLICIES = ("standby", "exit")
AT_LEAST_ONCE, EXACTLY_ONCE = "at-least-once", "exactly-once"
DELIVERY_MODES = (AT_LEAST_ONCE, EXACTLY_ONCE)  # RELAY_DELIVERY (relay.kafka.modes)
START_KEYWORDS = ("oplog-start", "now")  # RELAY_START_AT values that are not a time

# How long one blocking wait (delivery reports, a Kafka transaction call, a poll) lasts at most,
# so the loop turns and the lease heartbeat runs between waits.
WAIT_SLICE_S = 0.5


def parse_time(setting: str, text: str, others: str = "") -> dt.datetime:
    """The one parser of a time a user gives (RELAY_START_AT, `replay --since` and `--until`): ISO
    8601 as an aware UTC datetime, UTC when it names no zone (`Z` and offsets both read).
    ConfigError naming `setting` otherwise; `others` lists the setting's other values for it."""
    try:
        moment = dt.datetime.fromisoformat(text.strip().upper())  # `z` too
    except ValueError as exc:
        raise ConfigError(
            setting, f"must be {others}an ISO 8601 time (e.g. 2026-11-27T10:00:00Z); got {text!r}"
        ) from exc
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def start_at_time(start_at: str) -> dt.datetime | None:
    """The operator-given start time of RELAY_START_AT, or None for `oplog-start` / `now`."""
    if start_at in START_KEYWORDS:
        return None
    return parse_time(env_name("start_at"), start_at, others=f"{', '.join(START_KEYWORDS)}, or ")


def positive(value: float, setting: str) -> None:
    """The one rule for a count, a size or a period: ConfigError naming `setting` unless `value` > 0."""
    if value <= 0:
        raise ConfigError(setting, f"must be greater than 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class LeaseTiming:
    """How long a lease lasts and how often its holder and the standbys act (RELAY_LEASE_TTL_S,
    RELAY_HEARTBEAT_INTERVAL_S, RELAY_STANDBY_POLL_S); the loop, the group and the health checks
    share it.

    Invariants checked here: every period is positive; the lease is renewed at least twice per TTL
    (`heartbeat_interval_s` <= `lease_ttl_s` / 2), so a healthy leader never loses it.
    """

    lease_ttl_s: float
    heartbeat_interval_s: float
    standby_poll_s: float

    def __post_init__(self) -> None:
        for name in ("lease_ttl_s", "heartbeat_interval_s", "standby_poll_s"):
            positive(getattr(self, name), env_name(name))
        if self.heartbeat_interval_s * 2 > self.lease_ttl_s:
            raise ConfigError(
                env_name("heartbeat_interval_s"),
                f"must be at most half of RELAY_LEASE_TTL_S ({self.lease_ttl_s}) "
                "so the lease is renewed before it expires",
            )


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """The loop's limits, timing and policies (relay.core.loop.Relay).

    Invariants checked here: every size and period is positive (the checkpoint interval may be 0:
    after every batch); the policies are ones the loop
    knows; RELAY_START_AT is `oplog-start`, `now` or an ISO-8601 time.
    """

    timing: LeaseTiming
    # Most events handed to Kafka and not yet acknowledged (RELAY_BATCH_MAX_EVENTS: its public
    # name predates the window; it caps what is in flight, whatever the reads' sizes).
    max_in_flight_events: int
    batch_max_bytes: int
    pipeline_depth: int
    restart_backoff_max_s: float
    # RELAY_CHECKPOINT_INTERVAL_MS: most often the process's checkpoints are written (relay.core.coalescer).
    checkpoint_interval_ms: int
    # RELAY_CHECKPOINT_MAX_EVENTS: most events acknowledged, by all the process's loops, before
    # the checkpoints are written, whether or not the interval has passed (relay.core.coalescer).
    checkpoint_max_events: int
    on_poison: str
    on_history_lost: str
    on_lease_lost: str
    start_at: str
    # RELAY_DELIVERY=exactly-once: the events one Kafka transaction may hold over several reads
    # (RELAY_TRANSACTION_MAX_EVENTS), which the window then holds until the commit; None otherwise.
    transaction_max_events: int | None

    def __post_init__(self) -> None:
        positive(self.max_in_flight_events, env_name("batch_max_events"))
        for name in ("batch_max_bytes", "pipeline_depth", "restart_backoff_max_s", "checkpoint_max_events"):
            positive(getattr(self, name), env_name(name))
        if self.checkpoint_interval_ms < 0:
            raise ConfigError(
                env_name("checkpoint_interval_ms"), f"must be 0 or more, got {self.checkpoint_interval_ms}"
            )
        if self.transaction_max_events is not None:
            positive(self.transaction_max_events, env_name("transaction_max_events"))
        for name, allowed in (
            ("on_poison", POISON_POLICIES),
            ("on_history_lost", HISTORY_LOST_POLICIES),
            ("on_lease_lost", LEASE_LOST_POLICIES),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(env_name(name), f"must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        start_at_time(self.start_at)  # raises ConfigError

"""Observation at the edge: the loop reports what happened, this module decides what it means.

The loop calls the hooks of `ScopeObserver` (`tick`, `role`, `published`, `checkpoint_stored`,
`restart`, `lease_lost`, `stopped`, `dead_lettered`, `resumed`, `watch_publisher`); it turns them
into metrics (`relay.ops.metrics`), health (`relay.ops.health`), log lines (`relay.ops.logs`) and a
periodic summary line. The loop never touches a metric or a log format itself.

Contracts:
- Every hook is called on the relay's loop thread; the HTTP server reads on its own thread.
- `published()` is called once per batch, when Kafka has acknowledged every message of it; the
  time of that call is the acknowledgement time of the batch's events.
- Per-event work in `published()` is a few dict and list operations (topic totals are added
  once per topic per batch, the latency histogram takes a whole batch under one lock); no
  metric child is looked up per event.
- Log records emitted on a loop thread carry `instance`, `fencing` (the held fencing token)
  and `token` (a short prefix of the last stored checkpoint); lines about events also carry
  `event_id`.
- `stopped()` writes the one ERROR line of a stop: `error_kind`, `event_id` (when an event is
  to blame), `reason` and `exit_code` as fields, before any shutdown line.

A process runs one relay loop per scope (an outbox, or a partition of it; relay.group.runner):
`ProcessObserver` is the process's (one registry, the health checks, the HTTP server, the stop
line of a failed start), and gives each loop its own `ScopeObserver` (its metrics are the scope's
view of the one registry; its log lines carry `outbox`, and `partition` with several).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

from relay.core.errors import EXIT_FATAL, RelayError, cause_of
from relay.core.namespace import Namespace
from relay.core.partitions import Scope
from relay.core.positions import short_token, token_cluster_time
from relay.ops.config import ObserverConfig
from relay.ops.health import Health, serve
from relay.ops.logs import bind_loop_context
from relay.ops.metrics import RelayMetrics, latencies
from relay.ops.server_errors import as_relay_error, error_text

log = logging.getLogger("relay.observe")  # lines about batches of events
stop_log = logging.getLogger("relay")
summary_log = logging.getLogger("relay.summary")

SUMMARY_EVERY_S = 60.0


class _Queued(Protocol):
    @property
    def queued(self) -> int: ...


class ScopeObserver:
    """Counts and logs what one scope's relay loop reports; feeds the process's health.

    Made by `ProcessObserver.loop`. The period of the summary line is the process observer's
    `summary_every_s` (an attribute, so tests can shorten it).
    """

    def __init__(self, process: ProcessObserver, scope: Scope) -> None:
        config = process.config
        self.config = config
        self.scope = scope
        self._process = process
        self.metrics = process.metrics.loop(scope, self.checkpoint_lag, self._queued)
        self.health = process.health.loop(scope, self._queued)
        self._publisher: Callable[[], _Queued | None] = lambda: None
        self._role = "starting"
        self._fencing: int | None = None
        self._token: Any = None  # the last checkpoint this replica stored
        self._checkpoint_unix: int | None = None  # its cluster time, while holding the lease
        self._log_fields: dict[str, Any] = {"instance": config.instance_id, **scope.log_fields}
        self._last_summary = time.monotonic()
        self._summary_published = 0.0

    @property
    def registry(self) -> Any:
        """The Prometheus registry of the process's metrics."""
        return self.metrics.registry

    # ---- reports from the loop ------------------------------------------------------------------

    def tick(self) -> None:
        """The loop turned (a step began, or it waited a slice on Kafka or as a standby)."""
        bind_loop_context(self._log_fields)
        now = time.monotonic()
        self.health.turned(now)
        if now - self._last_summary >= self._process.summary_every_s:
            self._summary(now)

    def role(self, role: str, fencing_token: int | None) -> None:
        """This replica is now `leader` (holding the lease with `fencing_token`) or `standby`."""
        self._role = role
        self._fencing = fencing_token
        self._log_fields["fencing"] = fencing_token
        self.health.became(role)
        self.metrics.lease_held.set(1 if role == "leader" else 0)
        self.metrics.fencing.set(fencing_token or 0)
        if role != "leader":
            self._checkpoint_unix = None  # the stored checkpoint is the leader's to report
        self.tick()

    def watch_publisher(self, publisher: _Queued) -> None:
        """The producer the loop now uses; its queue depth is read at scrape time (weakly held)."""
        self._publisher = weakref.ref(publisher)

    def published(
        self, wall_ms: Sequence[int], messages: Sequence[Any], seconds: float, token: Any, read_seconds: float
    ) -> None:
        """Kafka acknowledged every message of a batch (`wall_ms`: its changes' commit times in
        Unix ms, -1 where unknown; `token`: the one covering it, stored next; `read_seconds`:
        since its changes were read)."""
        m = self.metrics
        acked = time.time()
        n = m.count_published(messages)
        m.latency.observe_many(latencies(wall_ms, acked))
        m.own_latency.observe_repeated(read_seconds, n)
        m.batches.inc()
        m.batch_seconds.observe(seconds)
        self.health.progressed()
        if messages and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "published %d events (%s … %s)",
                len(messages),
                messages[0].event_id,
                messages[-1].event_id,
                extra={
                    "event_id": messages[-1].event_id,
                    "first_event_id": messages[0].event_id,
                    "events": len(messages),
                    "token": short_token(token),
                },
            )

    def checkpoint_stored(self, token: Any) -> None:
        """`token` is stored as the checkpoint (every event before it is acknowledged)."""
        self._token = token
        self._log_fields["token"] = short_token(token)
        ts = token_cluster_time(token)
        if ts is not None:
            self._checkpoint_unix = ts.time
            self.metrics.checkpoint_time.set(ts.time)

    def resumed(self) -> None:
        """The change source resumed the stream after a resumable error (no restart)."""
        self.metrics.resumes.inc()

    def dead_lettered(self, event_id: str, reason: str) -> None:
        """A poison event goes to the dead-letter topic in its place."""
        self.metrics.dead_letters.inc()
        self.metrics.error("PoisonEventError", "dead-letter")
        stop_log.error(
            "dead-lettering event %s of %s to %s: %s",
            event_id,
            self.scope.namespace,
            self.config.dead_letter_topic,
            reason,
            extra={"event_id": event_id, "reason": reason},
        )

    def restart(self, exc: BaseException, delay_s: float) -> None:
        """The loop drops the producer and the stream and restarts from the checkpoint."""
        kind = type(exc).__name__
        self.metrics.restart(kind)
        self.metrics.error(kind, "restart")
        self.health.restarting(kind)
        stop_log.warning(
            "restarting from the checkpoint in %.1fs after: %s", delay_s, error_text(exc), extra={"error_kind": kind}
        )

    def lease_lost(self, exc: BaseException) -> None:
        """A fenced write matched nothing: back to standby."""
        self.metrics.error(type(exc).__name__, "standby")
        stop_log.warning("%s; back to standby", error_text(exc), extra={"error_kind": type(exc).__name__})

    def stopped(self, exc: BaseException) -> None:
        """The relay stops on `exc`: one ERROR line with the kind, the event, the reason and the
        exit code (before the shutdown lines)."""
        kind = type(exc).__name__
        self.metrics.error(kind, "stop")
        self.health.stopped(kind)
        self._role = "stopped"
        write_stop_line(exc, {"outbox": str(self.scope.namespace)})

    # ---- derived values ---------------------------------------------------------------------------

    @property
    def checkpoint(self) -> Any:
        """The last token this replica stored as the checkpoint (None before the first)."""
        return self._token

    def checkpoint_lag(self) -> float | None:
        """Seconds from the cluster time of the stored checkpoint to now (lease holder only)."""
        if self._role != "leader" or self._checkpoint_unix is None:
            return None
        return time.time() - self._checkpoint_unix

    def _queued(self) -> float:
        publisher = self._publisher()
        return float(publisher.queued) if publisher is not None else 0.0

    def ready(self) -> bool:
        """Connected and turning: leader publishing or standby polling, not restarting or stalled."""
        return self.health.readiness()[0]

    # ---- the summary line ---------------------------------------------------------------------------

    def _summary(self, now: float) -> None:
        interval = max(now - self._last_summary, 1e-9)
        totals = self.metrics.totals()
        published = int(totals["published"])
        recent = published - self._summary_published
        self._last_summary, self._summary_published = now, published
        lag = self.checkpoint_lag()
        queued = int(self._queued())
        summary_log.info(
            "summary: role=%s fencing=%s published=%d (+%d in %.0fs, %.1f/s) batches=%d restarts=%d "
            "dead_letters=%d errors=%d checkpoint=%s lag=%s queue=%d",
            self._role,
            self._fencing,
            published,
            recent,
            interval,
            recent / interval,
            totals["batches"],
            totals["restarts"],
            totals["dead_letters"],
            totals["errors"],
            short_token(self._token),
            "-" if lag is None else f"{lag:.1f}s",
            queued,
            extra={
                "summary": True,
                "role": self._role,
                "published_total": published,
                "published_recent": recent,
                "events_per_second": round(recent / interval, 2),
                "batches_total": int(totals["batches"]),
                "restarts_total": int(totals["restarts"]),
                "dead_letters_total": int(totals["dead_letters"]),
                "errors_total": int(totals["errors"]),
                "checkpoint_lag_s": None if lag is None else round(lag, 3),
                "producer_queue": queued,
            },
        )


def write_stop_line(exc: BaseException, where: Mapping[str, Any] | None = None) -> None:
    """The one ERROR line of a stop: the kind, the event, the reason, the exit code, and the
    driver's error that caused it (`cause`, when the relay's error was raised from one); `where`
    adds fields that locate the event (the inbox's topic, partition and offset).

    A driver's exception is written as the relay error it amounts to (relay.ops.server_errors:
    an unexpected server error is a ServerRefusedError, exit 5), marked logged. The traceback
    is on the line only for an unexpected failure of the relay itself (exit 1), or at DEBUG."""
    exc = as_relay_error(exc)
    if isinstance(exc, RelayError):
        exc.logged = True
    kind = type(exc).__name__
    exit_code = getattr(exc, "exit_code", EXIT_FATAL)
    event_id = getattr(exc, "event_id", None)
    reason = getattr(exc, "reason", None) or str(exc)
    stop_log.error(
        "stopping on %s: %s",
        kind,
        exc,
        exc_info=exit_code == EXIT_FATAL or stop_log.isEnabledFor(logging.DEBUG),
        extra={
            "error_kind": kind,
            "event_id": event_id,
            "reason": reason,
            "exit_code": exit_code,
            "cause": cause_of(exc),
            "refused": [{"action": a, "resource": r} for a, r in getattr(exc, "refused", [])] or None,
            **(where or {}),
        },
    )


class ProcessObserver:
    """What a relay process publishing `outboxes` reports: one registry (relay.ops.metrics.RelayMetrics), the health
    checks of its coordinator and loops, the HTTP server, one `ScopeObserver` per loop (`loop()`),
    and the stop line of a failed start (`stopped()`).

    `summary_every_s` (an attribute, so tests can shorten it) is the period of each loop's summary line.
    """

    def __init__(self, config: ObserverConfig, outboxes: Sequence[Namespace]) -> None:
        self.config = config
        self.metrics = RelayMetrics(config.instance_id, outboxes, config.partitions, config.broker)
        self.health = Health(config.health)
        self.loops: dict[Scope, ScopeObserver] = {}
        self.summary_every_s = SUMMARY_EVERY_S

    @property
    def registry(self) -> Any:
        """The Prometheus registry of this process's metrics."""
        return self.metrics.registry

    def loop(self, scope: Scope) -> ScopeObserver:
        """The observer of `scope`'s relay loop."""
        self.loops[scope] = observer = ScopeObserver(self, scope)
        return observer

    def serve(self) -> ThreadingHTTPServer | None:
        """/metrics, /livez, /readyz on RELAY_HTTP_HOST:RELAY_HTTP_PORT (see relay.ops.health.serve)."""
        return serve(self.config.http_port, self.health, self.metrics.registry, self.config.http_host)

    def tick(self, led: int, target: int) -> None:
        """The group's coordinator turned: this replica leads `led` partitions, its share is `target`."""
        self.health.turned(time.monotonic())
        self.metrics.partitions_led.set(led)
        self.metrics.partitions_target.set(target)

    def stopped(self, exc: BaseException) -> None:
        """The process stops on `exc` before any loop ran (the start-up checks)."""
        self.metrics.process_error(type(exc).__name__)
        self.health.stopped(type(exc).__name__)
        write_stop_line(exc)

    def ready(self) -> bool:
        return self.health.ready()

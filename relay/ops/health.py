"""Health: what /livez and /readyz answer, and the HTTP server for them and /metrics.

Liveness means the loops turn; readiness means the relay is connected and doing its job, as the
publishing lease holder or as a standby ready to take over. Each loop's reports reach its
`LoopHealth` through its `relay.ops.observe.ScopeObserver`, the group's coordinator's through
`relay.ops.observe.ProcessObserver`; the HTTP server reads `Health` on its own thread. /readyz
answers for the process and, under `outboxes`, for each outbox.
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.partitions import Scope
from relay.ops.config import HealthConfig

# A leader with messages in the producer's queue and no batch acknowledged for this long is not
# publishing (broker unreachable or refusing): unready, though its loop still turns.
PUBLISH_STALL_S = 30.0


class _Degradable:
    """Warnings that leave the relay ready but say something needs attention (/readyz answers
    200 with `"status": "degraded"` and the reasons), e.g. a TTL index about to delete an
    undelivered event (relay.ops.outbox_checks), one per outbox. A ready relay's body is
    unchanged otherwise."""

    def __init__(self) -> None:
        self._degraded: dict[str, str] = {}

    def degrade(self, reason: str | None, what: str = "") -> None:
        """Set (or, with None, clear) the warning about `what` (an outbox)."""
        if reason is None:
            self._degraded.pop(what, None)
        else:
            self._degraded[what] = reason

    @property
    def degraded(self) -> str | None:
        return "; ".join(self._degraded[k] for k in sorted(self._degraded)) or None


class LoopHealth:
    """Liveness and readiness of one relay loop (one scope's) from its reports, judged by the
    thresholds of the process's `Health`."""

    def __init__(self, thresholds: Health, queued: Callable[[], float]) -> None:
        self._thresholds = thresholds
        self._queued = queued
        now = time.monotonic()
        self.last_turn = now
        self._progress_at = now  # last acknowledged batch, or taking the lease
        self._ready = False
        self._why = "starting"
        self.role = "starting"

    # ---- reports ------------------------------------------------------------------------------

    def turned(self, now: float) -> None:
        self.last_turn = now

    def became(self, role: str) -> None:
        """`leader`, `standby` or `stopped` (with `stopped()`)."""
        self.role = role
        self._ready, self._why = True, role
        if role == "leader":
            self._progress_at = time.monotonic()

    def progressed(self) -> None:
        """A batch was acknowledged."""
        self._progress_at = time.monotonic()
        self._ready, self._why = True, self.role

    def restarting(self, kind: str) -> None:
        self._ready, self._why = False, f"restarting after {kind}"

    def stopped(self, kind: str) -> None:
        self.role = "stopped"
        self._ready, self._why = False, f"stopped on {kind}"

    # ---- answers ------------------------------------------------------------------------------

    def live(self) -> bool:
        """The loop turned within `live_stall_s` (a stuck loop fails this)."""
        return time.monotonic() - self.last_turn < self._thresholds.live_stall_s

    def readiness(self) -> tuple[bool, str]:
        """(ready, why): connected and turning, as a publishing leader or a standby."""
        now, limits = time.monotonic(), self._thresholds
        if not self._ready:
            return False, self._why
        if now - self.last_turn >= limits.ready_stall_s:
            return False, f"loop blocked for {now - self.last_turn:.0f}s (server unreachable?)"
        if self.role == "leader" and now - self._progress_at >= limits.publish_stall_s:
            queued = self._queued()
            if queued:
                return False, (
                    f"{queued:.0f} messages unacknowledged, nothing acknowledged for "
                    f"{now - self._progress_at:.0f}s (Kafka unreachable?)"
                )
        return True, self._why


class Health(_Degradable):
    """Liveness and readiness of the process: its group's coordinator (the heartbeat thread,
    relay.group.runner) and the loop of every scope it runs (`loop()`).

    Live while the coordinator and every loop turn; ready while every loop is ready (a publishing
    leader or a ready standby) and the coordinator turns. `role` is `leader` while this replica
    leads at least one lease. A reason names its scope only when there are several, so a relay of
    one unpartitioned outbox answers as it always did; `outboxes()` answers for each outbox.

    Thresholds (attributes, so tests can shorten them; every loop reads them here):
    - `live_stall_s`: /livez fails when a loop has not turned for this long. It is longer than any
      wait a loop makes while healthy or on a slow server (HealthConfig.live_stall_s), so only a
      loop that is stuck fails it.
    - `ready_stall_s`: /readyz fails when a loop has not turned for this long (a blocked getMore or
      write: MongoDB unreachable).
    - `publish_stall_s`: /readyz fails on a leader whose producer holds messages while no batch
      was acknowledged for this long (Kafka unreachable).
    """

    def __init__(self, config: HealthConfig) -> None:
        super().__init__()
        self.live_stall_s = config.live_stall_s
        self.ready_stall_s = config.ready_stall_s
        self.publish_stall_s = PUBLISH_STALL_S
        self._coordinator = LoopHealth(self, lambda: 0.0)
        self._coordinator.became("standby")
        self.loops: dict[Scope, LoopHealth] = {}
        self._stopped: str | None = None

    def loop(self, scope: Scope, queued: Callable[[], float]) -> LoopHealth:
        """The health of `scope`'s loop (`queued`: its producer's queue, read when asked)."""
        self.loops[scope] = health = LoopHealth(self, queued)
        return health

    def turned(self, now: float) -> None:
        """The coordinator turned."""
        self._coordinator.turned(now)

    def stopped(self, kind: str) -> None:
        """The process stops on `kind` before (or without) a loop saying so (start-up checks)."""
        self._stopped = kind

    @property
    def role(self) -> str:
        roles = {h.role for h in self.loops.values()}
        if self._stopped is not None or "stopped" in roles:
            return "stopped"
        if "leader" in roles:
            return "leader"
        return "standby" if roles == {"standby"} else "starting"

    @property
    def last_turn(self) -> float:
        return min([self._coordinator.last_turn, *(h.last_turn for h in self.loops.values())])

    def live(self) -> bool:
        return self._coordinator.live() and all(h.live() for h in self.loops.values())

    def readiness(self) -> tuple[bool, str]:
        if self._stopped is not None:
            return False, f"stopped on {self._stopped}"
        ok, why = self._coordinator.readiness()
        if not ok:
            return False, f"group heartbeat: {why}"
        for scope, health in sorted(self.loops.items()):
            ok, why = health.readiness()
            if not ok:
                return False, _reason(scope, why, among=len(self.loops))
        return True, self.role

    def outboxes(self) -> dict[str, dict[str, Any]]:
        """Each outbox's answer: ready while each of its loops is, `leader` while this replica leads
        one of its leases, the first reason it is not ready."""
        answers: dict[str, dict[str, Any]] = {}
        per_outbox = Counter(scope.namespace for scope in self.loops)
        for scope, health in sorted(self.loops.items()):
            ok, why = health.readiness()
            answer = answers.setdefault(str(scope.namespace), {"ok": True, "role": "standby"})
            if health.role == "leader" or answer["role"] == "standby":
                answer["role"] = health.role
            if answer["ok"] and not ok:
                answer.update(ok=False, reason=_reason(scope, why, among=per_outbox[scope.namespace]))
        return answers

    def ready(self) -> bool:
        return self.readiness()[0]


def _reason(scope: Scope, why: str, among: int) -> str:
    """The one rule for a reason: it names its scope (lease id) unless the answer covers that scope alone."""
    return why if among == 1 else f"{scope}: {why}"


def serve(port: int, health: Health, registry: CollectorRegistry, host: str = "0.0.0.0") -> ThreadingHTTPServer | None:
    """Serve /metrics, /livez, /readyz on `host`:`port` in a daemon thread (0: off).

    /livez and /readyz answer 200 or 503 with a small JSON body that says why (the role, the
    reason, seconds since the loop turned); /metrics the relay's counters. None of them shows a
    setting, a server address or an event's payload (docs/security.md). Raises ConfigError
    naming RELAY_HTTP_PORT (or RELAY_HTTP_HOST) when the address cannot be bound.
    """
    if not port:
        return None
    try:
        server = ThreadingHTTPServer((host, port), _handler(health, registry))
    except socket.gaierror as exc:
        raise ConfigError(env_name("http_host"), f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    except OSError as exc:
        setting = "http_host" if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) else "http_port"
        raise ConfigError(env_name(setting), f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="relay-http", daemon=True).start()
    return server


def _handler(health: Health, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                body, status = encoder(registry), 200
            elif path == "/livez":
                ok = health.live()
                body = _json(
                    {"ok": ok, "role": health.role, "lastTurnSecondsAgo": round(time.monotonic() - health.last_turn, 3)}
                )
                status, ctype = (200 if ok else 503), "application/json"
            elif path == "/readyz":
                ok, why = health.readiness()
                answer: dict[str, Any] = {"ok": ok, "role": health.role, "reason": why}
                if ok and health.degraded is not None:
                    answer.update(status="degraded", degraded=health.degraded)
                answer["outboxes"] = health.outboxes()
                body = _json(answer)
                status, ctype = (200 if ok else 503), "application/json"
            else:
                body, status, ctype = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _json(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"

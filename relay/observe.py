"""Observation at the edge: Prometheus metrics, /livez and /readyz, logging, a summary line.

The loop reports what happened (`published`, `committed`, `restart`, `role`, `tick`); this
module alone decides what to count and log. Every relay has its own metrics registry, so
several relays can run in one process (tests, the demo).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from relay.changes import short_token, token_cluster_time
from relay.config import Settings

prometheus_client.disable_created_metrics()
log = logging.getLogger("relay.summary")
_SUMMARY_EVERY_S = 60.0
# The loop ticks at least every getMore (max_await_ms) or delivery wait slice when healthy.
_READY_STALL_S = 10.0


class Observer:
    """Counts and logs what the loop reports; answers health checks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("relay_events_published", "Events acknowledged by Kafka", ["topic"], registry=r)
        self.bytes = Counter("relay_bytes_published", "Value bytes acknowledged by Kafka", ["topic"], registry=r)
        self.batches = Counter("relay_batches", "Batches published and checkpointed", registry=r)
        self.restarts = Counter("relay_restarts", "Restarts from the checkpoint, by error kind", ["kind"], registry=r)
        self.batch_seconds = Histogram("relay_batch_seconds", "Encode, publish and acknowledge one batch",
                                       registry=r)
        self.checkpoint_time = Gauge("relay_checkpoint_cluster_time_seconds",
                                     "Cluster time of the stored token (Unix seconds)", registry=r)
        self.lease_held = Gauge("relay_lease_held", "1 while this replica holds the lease", registry=r)
        self.dead_letters = Counter("relay_dead_letters", "Poison events sent to the dead-letter topic",
                                    registry=r)
        self.resumes = Counter("relay_stream_resumes", "Change stream resumes by the driver after resumable errors",
                               registry=r)
        self.fencing = Gauge("relay_fencing_token", "Fencing token of the held lease", registry=r)
        self._last_tick = time.monotonic()
        self._ready = False
        self._role = "starting"
        self._published = 0
        self._batches = 0
        self._restarts = 0
        self._fencing: int | None = None
        self._last_summary = time.monotonic()
        self._token: Any = None

    # ---- reports from the loop -----------------------------------------------------------------

    def tick(self) -> None:
        self._last_tick = time.monotonic()
        if self._last_tick - self._last_summary >= _SUMMARY_EVERY_S:
            self._summary()

    def role(self, role: str, fencing_token: int | None) -> None:
        self._role = role
        self._ready = True
        self.lease_held.set(1 if role == "leader" else 0)
        self.fencing.set(fencing_token or 0)
        self._fencing = fencing_token
        self.tick()

    def published(self, batch: Any, messages: Sequence[Any], seconds: float, token: Any) -> None:
        for m in messages:
            self.events.labels(m.topic).inc()
            self.bytes.labels(m.topic).inc(len(m.value))
        self.batches.inc()
        self.batch_seconds.observe(seconds)
        self._published += len(messages)
        self._batches += 1
        self._ready = True
        log.debug("published %d events, last %s, token %s", len(messages), messages[-1].event_id,
                  short_token(token))

    def committed(self, token: Any) -> None:
        self._token = token
        ts = token_cluster_time(token)
        if ts is not None:
            self.checkpoint_time.set(ts.time)

    def resumed(self) -> None:
        self.resumes.inc()

    def dead_lettered(self, exc: BaseException) -> None:
        self.dead_letters.inc()

    def restart(self, exc: BaseException | None) -> None:
        self.restarts.labels(type(exc).__name__ if exc else "unknown").inc()
        self._restarts += 1
        self._ready = False

    # ---- health ------------------------------------------------------------------------------

    def live(self) -> bool:
        """The loop turned recently (a stuck loop fails this)."""
        return time.monotonic() - self._last_tick < max(30.0, 2 * self.settings.lease_ttl_s)

    def ready(self) -> bool:
        """Connected and turning: leader publishing or standby polling, not restarting or stalled."""
        return self._ready and time.monotonic() - self._last_tick < _READY_STALL_S

    def _summary(self) -> None:
        self._last_summary = time.monotonic()
        log.info("summary: role=%s published=%d batches=%d restarts=%d checkpoint=%s fencing=%s",
                 self._role, self._published, self._batches, self._restarts,
                 short_token(self._token), self._fencing)

    # ---- HTTP ---------------------------------------------------------------------------------

    def serve(self) -> ThreadingHTTPServer | None:
        """Serve /metrics, /livez, /readyz on RELAY_HTTP_PORT in a daemon thread (0: off)."""
        if not self.settings.http_port:
            return None
        observer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/metrics":
                    body, status = prometheus_client.generate_latest(observer.registry), 200
                    ctype = prometheus_client.CONTENT_TYPE_LATEST
                elif self.path in ("/livez", "/readyz"):
                    ok = observer.live() if self.path == "/livez" else observer.ready()
                    body = json.dumps({"ok": ok, "role": observer._role}).encode()
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

        server = ThreadingHTTPServer(("0.0.0.0", self.settings.http_port), Handler)
        threading.Thread(target=server.serve_forever, name="relay-http", daemon=True).start()
        return server


def setup_logging(level: str = "INFO") -> None:
    """Readable lines on stderr."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    logging.getLogger("kafka.admin").setLevel(logging.CRITICAL)
    # librdkafka's own log lines (connection attempts) only at DEBUG level of the relay.
    logging.getLogger("kafka.producer").setLevel(logging.ERROR if level.upper() != "DEBUG" else logging.DEBUG)

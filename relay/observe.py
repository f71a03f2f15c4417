"""Observation at the edge: Prometheus metrics, /livez and /readyz, logging, a summary line.

The loop reports what happened (`tick`, `role`, `published`, `committed`, `restart`, `error`,
`dead_lettered`, `resumed`, `watch_publisher`); this module alone decides what to count, what
to log and what health means. Every relay has its own metrics registry, so several relays can
run in one process (tests, the demo).

Contracts:
- Every hook is called on the relay's loop thread; the HTTP server reads on its own thread.
- `published()` is called once per batch, when Kafka has acknowledged every message of it; the
  time of that call is the acknowledgement time of the batch's events.
- Per-event work in `published()` is a few dict and list operations (topic totals are added
  once per topic per batch, the latency histogram takes a whole batch under one lock); no
  metric child is looked up per event.
- Log records emitted on a loop thread carry `instance`, `fencing` (the held fencing token)
  and `token` (a short prefix of the last stored checkpoint) as `extra` fields; lines about
  events also carry `event_id`.
"""

from __future__ import annotations

import bisect
import datetime as dt
import importlib.metadata
import json
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from relay.changes import short_token, token_cluster_time
from relay.config import Settings, env_name
from relay.errors import Action, ConfigError, classify

prometheus_client.disable_created_metrics()
log = logging.getLogger("relay.observe")  # lines about batches of events
summary_log = logging.getLogger("relay.summary")

# Commit-to-acknowledgement latency: from a few milliseconds (steady state) to ten minutes
# (catching up after an outage).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0)
# A leader with messages in the producer's queue and no batch acknowledged for this long is not
# publishing (broker unreachable or refusing): unready, though its loop still turns.
PUBLISH_STALL_S = 30.0
SUMMARY_EVERY_S = 60.0


class _Queued(Protocol):
    @property
    def queued(self) -> int: ...


# ---- reading the commit time of a change event -------------------------------------------------

def wall_time_ms(change: Mapping[str, Any]) -> int | None:
    """The change event's `wallTime` (its commit time on the primary) in Unix milliseconds;
    None when the event has none (e.g. the synthetic changes of a rescan)."""
    value = change.get("wallTime")
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return int(value.timestamp() * 1000)
    return None


# ---- collectors that are cheap on the hot path or computed at scrape time -----------------------

class BatchHistogram(Collector):
    """A Prometheus histogram fed a batch of values at a time.

    `observe_many` places each value with one bisect into a local count list and adds the
    counts under one lock, where prometheus_client's `Histogram.observe` takes a lock and
    updates every bucket per value. Exposed exactly like a `Histogram` (`_bucket`, `_sum`,
    `_count`).
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self._name, self._doc = name, documentation
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._doc)

    def observe_many(self, values: Iterable[float]) -> int:
        """Add every value; returns how many there were."""
        bounds, place = self._bounds, bisect.bisect_left  # le: a value equal to a bound is in it
        counts = [0] * len(self._counts)
        total = 0.0
        for v in values:
            counts[place(bounds, v)] += 1
            total += v
        n = sum(counts)
        if n:
            with self._lock:
                for i, c in enumerate(counts):
                    if c:
                        self._counts[i] += c
                self._sum += total
        return n

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip((*[repr(b) for b in self._bounds], "+Inf"), counts):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        yield HistogramMetricFamily(self._name, self._doc, buckets=buckets, sum_value=total)


class _CheckpointLag(Collector):
    """`relay_checkpoint_lag_seconds`, computed at scrape time; only the lease holder has one."""

    _NAME = "relay_checkpoint_lag_seconds"
    _DOC = "Now minus the cluster time of the stored checkpoint (only on the lease holder)"

    def __init__(self, observer: Observer, registry: CollectorRegistry) -> None:
        self._observer = observer
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._NAME, self._DOC)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self._NAME, self._DOC)
        lag = self._observer.checkpoint_lag()
        if lag is not None:
            family.add_metric([], lag)
        yield family


# ---- the observer -------------------------------------------------------------------------------

_loop = threading.local()  # the Observer of the relay loop running on this thread


class Observer:
    """Counts and logs what the loop reports; answers the health checks.

    Thresholds (attributes, so tests can shorten them):
    - `live_stall_s`: /livez fails when the loop has not turned for this long. It is longer
      than any wait the loop makes while healthy or on a slow server (three MongoDB socket
      timeouts, the longest restart backoff and a standby poll; at least 60 s), so only a loop
      that is stuck fails it.
    - `ready_stall_s`: /readyz fails when the loop has not turned for this long (a blocked
      getMore or write: MongoDB unreachable).
    - `publish_stall_s`: /readyz fails on a leader whose producer holds messages while no batch
      was acknowledged for this long (Kafka unreachable).
    - `summary_every_s`: the period of the summary log line.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        s = settings
        io_timeout_s = max(s.connect_timeout_s, 10.0)  # relay.mongo_client's socket timeout
        self.live_stall_s = max(60.0, 3 * io_timeout_s + s.restart_backoff_max_s + s.standby_poll_s)
        self.ready_stall_s = 10.0 + 2 * max(s.max_await_ms / 1000.0, s.standby_poll_s)
        self.publish_stall_s = PUBLISH_STALL_S
        self.summary_every_s = SUMMARY_EVERY_S

        self.registry = r = CollectorRegistry()
        self.events = Counter("relay_events_published", "Events acknowledged by Kafka, by topic",
                              ["topic"], registry=r)
        self.bytes = Counter("relay_bytes_published", "Message value bytes acknowledged by Kafka, by topic",
                             ["topic"], registry=r)
        self.batches = Counter("relay_batches", "Batches acknowledged by Kafka", registry=r)
        self.batch_seconds = Histogram("relay_batch_seconds",
                                       "From handing a batch to the producer until Kafka acknowledged all of it",
                                       registry=r)
        self.latency = BatchHistogram("relay_delivery_latency_seconds",
                                      "Per event: from its commit in MongoDB (change event wallTime) "
                                      "to Kafka's acknowledgement", LATENCY_BUCKETS, r)
        self.checkpoint_time = Gauge("relay_checkpoint_cluster_time_seconds",
                                     "Cluster time of the last checkpoint this replica stored (Unix seconds)",
                                     registry=r)
        _CheckpointLag(self, r)
        self.lease_held = Gauge("relay_lease_held", "1 while this replica holds the lease", registry=r)
        self.fencing = Gauge("relay_fencing_token", "Fencing token of the held lease (0 when not held)",
                             registry=r)
        self.errors = Counter("relay_errors", "Errors by exception name and what the relay did "
                              "(restart, standby, stop, dead-letter)", ["kind", "action"], registry=r)
        self.restarts = Counter("relay_restarts", "Restarts from the checkpoint, by error kind", ["kind"],
                                registry=r)
        self.dead_letters = Counter("relay_dead_letters", "Poison events sent to the dead-letter topic",
                                    registry=r)
        self.resumes = Counter("relay_stream_resumes",
                               "Change stream resumes by the driver after resumable errors", registry=r)
        self.producer_queue = Gauge("relay_producer_queue_messages",
                                    "Messages in the producer awaiting a delivery report", registry=r)
        self.producer_queue.set_function(self._queued)
        # `replica`, not `instance`: Prometheus sets `instance` to the scraped target.
        Info("relay", "This relay: replica (RELAY_INSTANCE_ID), outbox, version", registry=r).info({
            "replica": s.instance_id, "outbox": s.namespace, "version": _version()})
        prometheus_client.ProcessCollector(registry=r)

        self._topics: dict[str, tuple[Any, Any]] = {}
        self._publisher: Callable[[], _Queued | None] = lambda: None
        now = time.monotonic()
        self._last_tick = now
        self._progress_at = now  # last acknowledged batch, or taking the lease
        self._ready = False
        self._why = "starting"
        self._role = "starting"
        self._fencing: int | None = None
        self._token: Any = None  # the last checkpoint this replica stored
        self._checkpoint_unix: int | None = None  # its cluster time, while holding the lease
        self._published = self._batches = self._restarts = self._dead = self._errors = 0
        self._last_summary = now
        self._summary_published = 0

    # ---- reports from the loop ------------------------------------------------------------------

    def tick(self) -> None:
        """The loop turned (a step began, or it waited a slice on Kafka or as a standby)."""
        _loop.observer = self
        self._last_tick = now = time.monotonic()
        if now - self._last_summary >= self.summary_every_s:
            self._summary(now)

    def role(self, role: str, fencing_token: int | None) -> None:
        """This replica is now `leader` (holding the lease with `fencing_token`) or `standby`."""
        self._role = role
        self._ready, self._why = True, role
        self._fencing = fencing_token
        self.lease_held.set(1 if role == "leader" else 0)
        self.fencing.set(fencing_token or 0)
        if role == "leader":
            self._progress_at = time.monotonic()
        else:
            self._checkpoint_unix = None  # the stored checkpoint is the leader's to report
        self.tick()

    def watch_publisher(self, publisher: _Queued) -> None:
        """The producer the loop now uses; its queue depth is read at scrape time (weakly held)."""
        self._publisher = weakref.ref(publisher)  # type: ignore[assignment]

    def published(self, batch: Any, messages: Sequence[Any], seconds: float, token: Any) -> None:
        """Kafka acknowledged every message of `batch` (its `changes` are the change events)."""
        acked = time.time()
        per_topic: dict[str, list[int]] = {}
        for m in messages:
            totals = per_topic.get(m.topic)
            if totals is None:
                totals = per_topic[m.topic] = [0, 0]
            totals[0] += 1
            totals[1] += len(m.value)
        for topic, (count, size) in per_topic.items():
            events, sizes = self._topic(topic)
            events.inc(count)
            sizes.inc(size)
        self.latency.observe_many(_latencies(batch.changes, acked))
        self.batches.inc()
        self.batch_seconds.observe(seconds)
        self._published += len(messages)
        self._batches += 1
        self._progress_at = time.monotonic()
        self._ready, self._why = True, self._role
        if messages and log.isEnabledFor(logging.DEBUG):
            log.debug("published %d events (%s … %s)", len(messages), messages[0].event_id,
                      messages[-1].event_id, extra={"event_id": messages[-1].event_id,
                                                    "first_event_id": messages[0].event_id,
                                                    "events": len(messages), "token": short_token(token),
                                                    "fencing": self._fencing})

    def committed(self, token: Any) -> None:
        """`token` is stored as the checkpoint (every event before it is acknowledged)."""
        self._token = token
        ts = token_cluster_time(token)
        if ts is not None:
            self._checkpoint_unix = ts.time
            self.checkpoint_time.set(ts.time)

    def resumed(self) -> None:
        """The driver resumed the change stream after a resumable error (no restart)."""
        self.resumes.inc()

    def dead_lettered(self, exc: BaseException) -> None:
        """A poison event goes to the dead-letter topic in its place."""
        self.dead_letters.inc()
        self.errors.labels(type(exc).__name__, "dead-letter").inc()
        self._dead += 1
        self._errors += 1

    def restart(self, exc: BaseException | None) -> None:
        """The loop drops the producer and the stream and restarts from the checkpoint."""
        kind = type(exc).__name__ if exc else "unknown"
        self.restarts.labels(kind).inc()
        self.errors.labels(kind, "restart").inc()
        self._restarts += 1
        self._errors += 1
        self._ready, self._why = False, f"restarting after {kind}"

    def error(self, exc: BaseException) -> None:
        """An error ended the leading cycle without a restart: back to standby, or stopping."""
        action = classify(exc)
        if action is Action.STANDBY and self.settings.on_lease_lost == "exit":
            action = Action.STOP
        self.errors.labels(type(exc).__name__, action.value).inc()
        self._errors += 1
        if action is Action.STOP:
            self._role = "stopped"
            self._ready, self._why = False, f"stopped on {type(exc).__name__}"

    # ---- derived values ---------------------------------------------------------------------------

    def checkpoint_lag(self) -> float | None:
        """Seconds from the cluster time of the stored checkpoint to now (lease holder only)."""
        if self._role != "leader" or self._checkpoint_unix is None:
            return None
        return time.time() - self._checkpoint_unix

    def _queued(self) -> float:
        publisher = self._publisher()
        return float(publisher.queued) if publisher is not None else 0.0

    def _topic(self, topic: str) -> tuple[Any, Any]:
        children = self._topics.get(topic)
        if children is None:
            children = self._topics[topic] = (self.events.labels(topic), self.bytes.labels(topic))
        return children

    # ---- health -------------------------------------------------------------------------------------

    def live(self) -> bool:
        """The loop turned within `live_stall_s` (a stuck loop fails this)."""
        return time.monotonic() - self._last_tick < self.live_stall_s

    def readiness(self) -> tuple[bool, str]:
        """(ready, why): connected and turning, as a publishing leader or a standby."""
        now = time.monotonic()
        if not self._ready:
            return False, self._why
        if now - self._last_tick >= self.ready_stall_s:
            return False, f"loop blocked for {now - self._last_tick:.0f}s (server unreachable?)"
        if self._role == "leader" and now - self._progress_at >= self.publish_stall_s:
            queued = self._queued()
            if queued:
                return False, (f"{queued:.0f} messages unacknowledged, nothing acknowledged for "
                               f"{now - self._progress_at:.0f}s (Kafka unreachable?)")
        return True, self._why

    def ready(self) -> bool:
        """Connected and turning: leader publishing or standby polling, not restarting or stalled."""
        return self.readiness()[0]

    # ---- the summary line ---------------------------------------------------------------------------

    def _summary(self, now: float) -> None:
        interval = max(now - self._last_summary, 1e-9)
        recent = self._published - self._summary_published
        self._last_summary, self._summary_published = now, self._published
        lag = self.checkpoint_lag()
        queued = int(self._queued())
        summary_log.info(
            "summary: role=%s fencing=%s published=%d (+%d in %.0fs, %.1f/s) batches=%d restarts=%d "
            "dead_letters=%d errors=%d checkpoint=%s lag=%s queue=%d",
            self._role, self._fencing, self._published, recent, interval, recent / interval,
            self._batches, self._restarts, self._dead, self._errors, short_token(self._token),
            "-" if lag is None else f"{lag:.1f}s", queued,
            extra={"summary": True, "role": self._role, "published_total": self._published,
                   "published_recent": recent, "events_per_second": round(recent / interval, 2),
                   "batches_total": self._batches, "restarts_total": self._restarts,
                   "dead_letters_total": self._dead, "errors_total": self._errors,
                   "checkpoint_lag_s": None if lag is None else round(lag, 3), "producer_queue": queued})

    # ---- HTTP ---------------------------------------------------------------------------------------

    def serve(self) -> ThreadingHTTPServer | None:
        """Serve /metrics, /livez, /readyz on RELAY_HTTP_PORT in a daemon thread (0: off).

        /livez and /readyz answer 200 or 503 with a small JSON body that says why. Raises
        ConfigError naming RELAY_HTTP_PORT when the port cannot be bound.
        """
        if not self.settings.http_port:
            return None
        handler = _handler(self)
        try:
            server = ThreadingHTTPServer(("0.0.0.0", self.settings.http_port), handler)
        except OSError as exc:
            raise ConfigError(env_name("http_port"),
                              f"cannot listen on port {self.settings.http_port}: {exc.strerror}") from None
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="relay-http", daemon=True).start()
        return server


def _handler(observer: Observer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                body, status = encoder(observer.registry), 200
            elif path == "/livez":
                ok = observer.live()
                body = _json({"ok": ok, "role": observer._role,
                              "lastTurnSecondsAgo": round(time.monotonic() - observer._last_tick, 3)})
                status, ctype = (200 if ok else 503), "application/json"
            elif path == "/readyz":
                ok, why = observer.readiness()
                body = _json({"ok": ok, "role": observer._role, "reason": why})
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


def _latencies(changes: Iterable[Any], acked: float) -> Iterator[float]:
    for change in changes:
        ms = wall_time_ms(change)
        if ms is not None:
            latency = acked - ms / 1000.0
            yield latency if latency > 0.0 else 0.0  # clocks of MongoDB and the relay may differ


def _version() -> str:
    try:
        return importlib.metadata.version("outbox-relay")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ---- logging ------------------------------------------------------------------------------------

LOG_FORMATS = ("auto", "json", "text")
# Attributes every LogRecord has; anything else on a record came from `extra` or a filter.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_TEXT_HIDDEN = frozenset({"instance", "summary"})  # in JSON only: noise on a terminal


class LoopContext(logging.Filter):
    """Adds `instance`, `fencing` and `token` to records emitted on a relay loop thread.

    Fields a log call passes in `extra` win.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        observer: Observer | None = getattr(_loop, "observer", None)
        if observer is not None:
            d = record.__dict__
            d.setdefault("instance", observer.settings.instance_id)
            if observer._fencing is not None:
                d.setdefault("fencing", observer._fencing)
            if observer._token is not None:
                d.setdefault("token", short_token(observer._token))
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items()
            if k not in _RECORD_FIELDS and not k.startswith("_") and v is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ms), level, logger, message, then every extra field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
                      .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={v}" for k, v in _extras(record).items() if k not in _TEXT_HIDDEN]
        if not fields:
            return line
        head, sep, tail = line.partition("\n")  # keep a traceback below the fields
        return f"{head}  {' '.join(fields)}{sep}{tail}"


def resolve_log_format(fmt: str, stream: IO[str]) -> str:
    """`auto` is `text` on a terminal and `json` otherwise (containers, files, pipes)."""
    if fmt != "auto":
        return fmt
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


def setup_logging(level: str = "INFO", fmt: str = "auto", stream: IO[str] | None = None) -> logging.Handler:
    """Log to stderr (or `stream`) as JSON lines or text (RELAY_LOG_FORMAT); returns the handler.

    Calling it again replaces the handler it installed before; other handlers stay.
    """
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if resolve_log_format(fmt, stream) == "json" else TextFormatter())
    handler.addFilter(LoopContext())
    handler._outbox_relay = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_outbox_relay", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("kafka.admin").setLevel(logging.CRITICAL)
    # librdkafka's own log lines (connection attempts) only at DEBUG level of the relay.
    logging.getLogger("kafka.producer").setLevel(logging.ERROR if level.upper() != "DEBUG" else logging.DEBUG)
    return handler

"""What the outbox checks report (relay.mongo.housekeeping), turned into metrics, a WARN line and
a degraded /readyz.

Series, each by `outbox`: `relay_outbox_documents` (estimated count), `relay_outbox_oldest_undelivered_age_seconds`
(by the event's occurrence time), `relay_outbox_ttl_headroom_seconds` (only with a TTL index:
its expiry minus that age), `relay_outbox_deleted_total` and `relay_outbox_cleanup_errors_total`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from relay.core.namespace import Namespace

log = logging.getLogger("relay.outbox")


class _Degrade(Protocol):
    def degrade(self, reason: str | None, what: str = "") -> None: ...


class OutboxSeries:
    """The outbox checks' series on a metrics registry, by `outbox` (registered once per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r, by = registry, ["outbox"]
        self.documents = Gauge(
            "relay_outbox_documents", "Documents in the outbox collection (estimated), by outbox", by, registry=r
        )
        self.oldest_age = Gauge(
            "relay_outbox_oldest_undelivered_age_seconds",
            "Age (occurrence time) of the oldest outbox event the stored checkpoint does not cover; 0 when none",
            by,
            registry=r,
        )
        self.headroom = Gauge(
            "relay_outbox_ttl_headroom_seconds",
            "TTL of the outbox's TTL index minus the age of the oldest undelivered event (only with a TTL index)",
            by,
            registry=r,
        )
        self.deleted = Counter(
            "relay_outbox_deleted", "Outbox documents deleted by clean-up (RELAY_OUTBOX_RETENTION)", by, registry=r
        )
        self.errors = Counter("relay_outbox_cleanup_errors", "Failed outbox checks or clean-up passes", by, registry=r)


class OutboxMetrics:
    """relay.mongo.housekeeping.OutboxReport of one outbox, on its series and the health object.

    The headroom sample exists only while the outbox has a TTL index (a child created at 0 would
    read as "no headroom left" to an alert on it)."""

    def __init__(self, series: OutboxSeries, health: _Degrade, namespace: Namespace) -> None:
        outbox = str(namespace)  # the `outbox` label, and what the WARN line and /readyz name
        self._health, self._outbox = health, outbox
        self.documents = series.documents.labels(outbox)
        self.oldest_age = series.oldest_age.labels(outbox)
        self._headroom = series.headroom
        self.deleted_total = series.deleted.labels(outbox)
        self.errors = series.errors.labels(outbox)
        self._warned = False

    def size(self, documents: int) -> None:
        self.documents.set(documents)

    def oldest_undelivered(self, age_s: float) -> None:
        self.oldest_age.set(age_s)

    def ttl_headroom(self, headroom_s: float | None, warn_below_s: float) -> None:
        if headroom_s is None:
            self._health.degrade(None, self._outbox)
            with contextlib.suppress(KeyError):  # no TTL index (any more): no sample
                self._headroom.remove(self._outbox)
            return
        self._headroom.labels(self._outbox).set(headroom_s)
        if headroom_s < warn_below_s:
            reason = (
                f"{self._outbox}: TTL headroom {headroom_s:.0f}s is below RELAY_TTL_HEADROOM_WARN_S={warn_below_s:.0f}s: the outbox's "
                "TTL index will delete events the relay has not published; catch up, or clean up by checkpoint "
                "(RELAY_OUTBOX_RETENTION) instead of a TTL index"
            )
            if not self._warned:
                log.warning(reason)
            self._warned = True
            self._health.degrade(reason, self._outbox)
        else:
            self._warned = False
            self._health.degrade(None, self._outbox)

    def deleted(self, count: int) -> None:
        self.deleted_total.inc(count)

    def cleanup_error(self, exc: BaseException) -> None:
        self.errors.inc()

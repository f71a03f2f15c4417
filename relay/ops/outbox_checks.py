"""What the outbox checks report (relay.mongo.housekeeping), turned into metrics, a WARN line and
a degraded /readyz.

Series: `relay_outbox_documents` (estimated count), `relay_outbox_oldest_undelivered_age_seconds`
(by the event's occurrence time), `relay_outbox_ttl_headroom_seconds` (only with a TTL index:
its expiry minus that age), `relay_outbox_deleted_total` and `relay_outbox_cleanup_errors_total`.
"""

from __future__ import annotations

import logging
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("relay.outbox")


class _Degrade(Protocol):
    def degrade(self, reason: str | None) -> None: ...


class OutboxMetrics:
    """relay.mongo.housekeeping.OutboxReport on a metrics registry and a health object."""

    def __init__(self, registry: CollectorRegistry, health: _Degrade) -> None:
        r = registry
        self._health = health
        self.documents = Gauge("relay_outbox_documents", "Documents in the outbox collection (estimated)", registry=r)
        self.oldest_age = Gauge(
            "relay_outbox_oldest_undelivered_age_seconds",
            "Age (occurrence time) of the oldest outbox event the committed position does not cover; 0 when none",
            registry=r,
        )
        self.headroom = Gauge(
            "relay_outbox_ttl_headroom_seconds",
            "TTL of the outbox's TTL index minus the age of the oldest undelivered event (only with a TTL index)",
            registry=r,
        )
        self.deleted_total = Counter(
            "relay_outbox_deleted", "Outbox documents deleted by clean-up (RELAY_OUTBOX_RETENTION)", registry=r
        )
        self.errors = Counter("relay_outbox_cleanup_errors", "Failed outbox checks or clean-up passes", registry=r)
        self._warned = False

    def size(self, documents: int) -> None:
        self.documents.set(documents)

    def oldest_undelivered(self, age_s: float) -> None:
        self.oldest_age.set(age_s)

    def ttl_headroom(self, headroom_s: float | None, warn_below_s: float) -> None:
        if headroom_s is None:
            self._health.degrade(None)
            return
        self.headroom.set(headroom_s)
        if headroom_s < warn_below_s:
            reason = (
                f"TTL headroom {headroom_s:.0f}s is below RELAY_TTL_HEADROOM_WARN_S={warn_below_s:.0f}s: the outbox's "
                "TTL index will delete events the relay has not published; catch up, or clean up by position "
                "(RELAY_OUTBOX_RETENTION) instead of a TTL index"
            )
            if not self._warned:
                log.warning(reason)
            self._warned = True
            self._health.degrade(reason)
        else:
            self._warned = False
            self._health.degrade(None)

    def deleted(self, count: int) -> None:
        self.deleted_total.inc(count)

    def cleanup_error(self, exc: BaseException) -> None:
        self.errors.inc()

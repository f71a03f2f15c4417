"""The inbox's Prometheus series, in the relay's naming style, on the registry the service chooses.

| metric | type | meaning |
| --- | --- | --- |
| `relay_inbox_events_processed_total{group,topic}` | counter | events whose handler ran in a committed transaction |
| `relay_inbox_duplicates_skipped_total{group,topic}` | counter | events skipped: already recorded, or repeated within a batch |
| `relay_inbox_handler_errors_total{group,topic}` | counter | handler calls that raised (poison events) |
| `relay_inbox_undecodable_total{group,topic}` | counter | messages that could not be decoded (poison events) |
| `relay_inbox_dead_letters_total{group,topic}` | counter | poison events sent to the dead-letter topic |
| `relay_inbox_transaction_retries_total{group}` | counter | batch transactions run again after a transient database error (by pymongo or by the inbox) |
| `relay_inbox_registry_retries_total{group}` | counter | batches decoded again because the Schema Registry could not be reached |
| `relay_inbox_batches_total{group}` | counter | batch transactions committed |
| `relay_inbox_batch_seconds{group}` | histogram | a batch's MongoDB transaction, from its start to its commit (pymongo's retries included) |
| `relay_inbox_lag_messages{group,topic,partition}` | gauge | per assigned partition: its end offset (last stable offset) minus the group's committed offset, from librdkafka's statistics; removed when the partition is revoked |

The series are registered once per registry (`series_on`) and shared by every inbox using it:
several inboxes, or one inbox run again, in one process on one registry, told apart by `group`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections import Counter as Tally
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from relay.inbox.event import InboxEvent

summary_log = logging.getLogger("relay.summary")
SUMMARY_EVERY_S = 60.0
TOPIC = ["group", "topic"]


class Series:
    """The inbox's series on one registry (one instance per registry: `series_on`)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.processed = Counter(
            "relay_inbox_events_processed", "Events handled in a committed transaction", TOPIC, registry=r
        )
        self.duplicates = Counter(
            "relay_inbox_duplicates_skipped", "Events skipped as already processed", TOPIC, registry=r
        )
        self.handler_errors = Counter("relay_inbox_handler_errors", "Handler calls that raised", TOPIC, registry=r)
        self.undecodable = Counter("relay_inbox_undecodable", "Messages that could not be decoded", TOPIC, registry=r)
        self.dead_letters = Counter(
            "relay_inbox_dead_letters", "Poison events sent to the dead-letter topic", TOPIC, registry=r
        )
        self.transaction_retries = Counter(
            "relay_inbox_transaction_retries",
            "Batch transactions retried after a transient error",
            ["group"],
            registry=r,
        )
        self.registry_retries = Counter(
            "relay_inbox_registry_retries",
            "Batches decoded again after the Schema Registry could not be reached",
            ["group"],
            registry=r,
        )
        self.batches = Counter("relay_inbox_batches", "Batch transactions committed", ["group"], registry=r)
        self.batch_seconds = Histogram(
            "relay_inbox_batch_seconds", "A batch's MongoDB transaction, start to commit", ["group"], registry=r
        )
        self.lag = Gauge(
            "relay_inbox_lag_messages", "End offset minus committed offset", ["group", "topic", "partition"], registry=r
        )


_series: weakref.WeakKeyDictionary[CollectorRegistry, Series] = weakref.WeakKeyDictionary()
_series_lock = threading.Lock()


def series_on(registry: CollectorRegistry) -> Series:
    """The inbox's series on `registry`, registered there the first time only."""
    with _series_lock:
        found = _series.get(registry)
        if found is None:
            found = _series[registry] = Series(registry)
        return found


def _per_topic(events: Iterable[InboxEvent]) -> Tally[str]:
    return Tally(e.topic for e in events)


class InboxMetrics:
    """One `run`'s view of the series (its `group` label) and the totals of its summary line."""

    def __init__(self, registry: CollectorRegistry | None = None, group: str = "") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.series = s = series_on(self.registry)
        self.group = group
        self.batches, self.batch_seconds = s.batches.labels(group), s.batch_seconds.labels(group)
        self.totals: Tally[str] = Tally()  # for the summary line
        self.summary_every_s = SUMMARY_EVERY_S
        self._last_summary = time.monotonic()
        self._summarized = 0
        self._lag_labels: set[tuple[str, int]] = set()

    def summarize(self, force: bool = False) -> None:
        """The periodic summary line (every `summary_every_s`, and at the end with `force`)."""
        now = time.monotonic()
        if not force and now - self._last_summary < self.summary_every_s:
            return
        interval = max(now - self._last_summary, 1e-9)
        recent = self.totals["processed"] - self._summarized
        self._last_summary, self._summarized = now, self.totals["processed"]
        fields = {f"{k}_total": self.totals[k] for k in ("processed", "duplicates", "batches", "retries", "poison")}
        summary_log.info(
            "inbox summary: group=%s processed=%d (+%d in %.0fs, %.1f/s) duplicates=%d batches=%d retries=%d poison=%d",
            self.group,
            self.totals["processed"],
            recent,
            interval,
            recent / interval,
            self.totals["duplicates"],
            self.totals["batches"],
            self.totals["retries"],
            self.totals["poison"],
            extra={"summary": True, "group": self.group, "events_per_second": round(recent / interval, 2), **fields},
        )

    def applied(self, ran: Sequence[InboxEvent], skipped: Sequence[InboxEvent], attempts: int) -> None:
        """One committed batch transaction (`attempts` - 1 of them retried inside pymongo)."""
        self.totals.update(processed=len(ran), duplicates=len(skipped), batches=1)
        self.batches.inc()
        if attempts > 1:
            self.retried("transaction", attempts - 1)
        for topic, n in _per_topic(ran).items():
            self.series.processed.labels(self.group, topic).inc(n)
        for topic, n in _per_topic(skipped).items():
            self.series.duplicates.labels(self.group, topic).inc(n)

    def retried(self, cause: str, times: int = 1) -> None:
        """A batch run again after a transient error: `cause` is `transaction` or `registry`.
        Every retry counts in the summary line's `retries`."""
        self.totals.update(retries=times)
        series = self.series.registry_retries if cause == "registry" else self.series.transaction_retries
        series.labels(self.group).inc(times)

    def poison(self, topic: str, kind: str) -> None:
        """A poison event: `kind` is `handler_errors`, `undecodable` or `dead_letters`."""
        getattr(self.series, kind).labels(self.group, topic).inc()

    def set_lags(self, lags: Mapping[tuple[str, int], int]) -> None:
        """The lag of each partition in `lags`; the partitions reported before and missing now
        (revoked, or the run ended: `set_lags({})`) lose their series."""
        for topic, partition in self._lag_labels - set(lags):
            with contextlib.suppress(KeyError):  # another inbox of the group on this registry removed it
                self.series.lag.remove(self.group, topic, str(partition))
        for (topic, partition), lag in lags.items():
            self.series.lag.labels(self.group, topic, str(partition)).set(max(lag, 0))
        self._lag_labels = set(lags)

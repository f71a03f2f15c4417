"""The inbox's Prometheus series, in the relay's naming style, on the registry the service chooses.

| metric | type | meaning |
| --- | --- | --- |
| `relay_inbox_events_processed_total{topic}` | counter | events whose handler ran in a committed transaction |
| `relay_inbox_duplicates_skipped_total{topic}` | counter | events skipped: already recorded, or repeated within a batch |
| `relay_inbox_handler_errors_total{topic}` | counter | handler calls that raised (poison events) |
| `relay_inbox_undecodable_total{topic}` | counter | messages that could not be decoded (poison events) |
| `relay_inbox_dead_letters_total{topic}` | counter | poison events sent to the dead-letter topic |
| `relay_inbox_transaction_retries_total` | counter | batch transactions run again after a transient error (write conflict, primary change) |
| `relay_inbox_batches_total` | counter | batch transactions committed |
| `relay_inbox_batch_seconds` | histogram | a batch's MongoDB transaction, from its start to its commit (retries included) |
| `relay_inbox_lag_messages{topic,partition}` | gauge | the partition's end offset minus the offset committed last (as last fetched) |
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from relay.inbox.event import InboxEvent

summary_log = logging.getLogger("relay.summary")
SUMMARY_EVERY_S = 60.0


def _per_topic(events: Iterable[InboxEvent]) -> Tally[str]:
    return Tally(e.topic for e in events)


class InboxMetrics:
    """The series above, registered on `registry` (a new CollectorRegistry by default; pass
    `prometheus_client.REGISTRY` to use the process's default one). One per Inbox."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.processed = Counter(
            "relay_inbox_events_processed", "Events handled in a committed transaction", ["topic"], registry=r
        )
        self.duplicates = Counter(
            "relay_inbox_duplicates_skipped", "Events skipped as already processed", ["topic"], registry=r
        )
        self.handler_errors = Counter("relay_inbox_handler_errors", "Handler calls that raised", ["topic"], registry=r)
        self.undecodable = Counter(
            "relay_inbox_undecodable", "Messages that could not be decoded", ["topic"], registry=r
        )
        self.dead_letters = Counter(
            "relay_inbox_dead_letters", "Poison events sent to the dead-letter topic", ["topic"], registry=r
        )
        self.retries = Counter(
            "relay_inbox_transaction_retries", "Batch transactions retried after a transient error", registry=r
        )
        self.batches = Counter("relay_inbox_batches", "Batch transactions committed", registry=r)
        self.batch_seconds = Histogram(
            "relay_inbox_batch_seconds", "A batch's MongoDB transaction, start to commit", registry=r
        )
        self.lag = Gauge(
            "relay_inbox_lag_messages", "End offset minus committed offset", ["topic", "partition"], registry=r
        )
        self.totals: Tally[str] = Tally()  # for the summary line
        self.summary_every_s = SUMMARY_EVERY_S
        self._last_summary = time.monotonic()
        self._summarized = 0

    def summarize(self, group: str, force: bool = False) -> None:
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
            group,
            self.totals["processed"],
            recent,
            interval,
            recent / interval,
            self.totals["duplicates"],
            self.totals["batches"],
            self.totals["retries"],
            self.totals["poison"],
            extra={"summary": True, "group": group, "events_per_second": round(recent / interval, 2), **fields},
        )

    def applied(self, ran: Sequence[InboxEvent], skipped: Sequence[InboxEvent], attempts: int) -> None:
        """One committed batch transaction."""
        self.totals.update(processed=len(ran), duplicates=len(skipped), batches=1, retries=attempts - 1)
        self.batches.inc()
        if attempts > 1:
            self.retries.inc(attempts - 1)
        for topic, n in _per_topic(ran).items():
            self.processed.labels(topic).inc(n)
        for topic, n in _per_topic(skipped).items():
            self.duplicates.labels(topic).inc(n)

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        self.lag.labels(topic, str(partition)).set(max(lag, 0))

"""Prometheus metrics of one relay process: the series, and the collectors cheap on the hot path.

A process runs one relay loop per partition it may lead (one without RELAY_PARTITIONS) and keeps
all their series in one registry (`RelayMetrics`; every process has its own, so several can run in
one process: tests, the demo). The series about one lease (held, fencing token, checkpoint time
and lag, batches, producer queue) carry a `partition` label when RELAY_PARTITIONS > 1, and none
without partitions, as they always did; each loop's view (`PartitionMetrics`) binds its children
once, never per event. The README's Metrics table lists every series; names follow Prometheus
conventions (`relay_..._total`, `_seconds`, `_bytes`). There are no `_created` series.
"""

from __future__ import annotations

import bisect
import importlib.metadata
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

prometheus_client.disable_created_metrics()

# Commit-to-acknowledgement latency: from a few milliseconds (steady state) to ten minutes
# (catching up after an outage).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# The relay's own share of an event's latency, from reading its change to Kafka's
# acknowledgement: a millisecond or two on a healthy broker, seconds when Kafka is slow.
OWN_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def latencies(wall_ms: Iterable[int], acked: float) -> Iterator[float]:
    """Seconds from each change's commit (its wallTime, Unix ms; -1: unknown, e.g. the synthetic
    changes of a rescan) to `acked` (Unix seconds), never negative: the clocks of MongoDB and the
    relay may differ."""
    for ms in wall_ms:
        if ms >= 0:
            latency = acked - ms / 1000.0
            yield latency if latency > 0.0 else 0.0


class BatchHistogram(Collector):
    """A Prometheus histogram fed a batch of values at a time.

    `observe_many` places each value with one bisect into a local count list and adds the
    counts under one lock, where prometheus_client's `Histogram.observe` takes a lock and
    updates every bucket per value. Exposed exactly like a `Histogram` (`_bucket`, `_sum`,
    `_count`).
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
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

    def observe_repeated(self, value: float, times: int) -> None:
        """Add `value` `times` times (every event of a batch acknowledged at once)."""
        if times > 0:
            i = bisect.bisect_left(self._bounds, value)
            with self._lock:
                self._counts[i] += times
                self._sum += value * times

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip((*[repr(b) for b in self._bounds], "+Inf"), counts, strict=False):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        yield HistogramMetricFamily(self._name, self._doc, buckets=buckets, sum_value=total)


class ScrapeTimeGauge(Collector):
    """A gauge computed when scraped: one sample per function `add`ed, labelled with its value of
    `label` (no label: at most one function, an unlabelled sample). A sample is absent while its
    function returns None."""

    def __init__(self, name: str, documentation: str, label: str | None, registry: CollectorRegistry) -> None:
        self._name, self._doc = name, documentation
        self._labels = [] if label is None else [label]
        self._values: dict[str, Callable[[], float | None]] = {}
        registry.register(self)

    def add(self, label_value: str, value: Callable[[], float | None]) -> None:
        """Sample `value()` at scrape time, as `label_value` (ignored without a label)."""
        self._values[label_value if self._labels else ""] = value

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._doc, labels=self._labels)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self._name, self._doc, labels=self._labels)
        for label_value, value in sorted(self._values.items(), key=lambda kv: int(kv[0] or 0)):
            v = value()
            if v is not None:
                family.add_metric([label_value] if self._labels else [], v)
        yield family


class RelayMetrics:
    """The series of one relay process, in their own registry (see the module docstring);
    `partition()` gives each loop its view."""

    def __init__(self, replica: str, outbox: str, partitions: int) -> None:
        self.registry = r = CollectorRegistry()
        self.labelled = partitions > 1  # the series about one lease are per partition
        self._published_series(r)
        self._lease_series(r)
        self._outcome_series(r)
        self.partitions_led = Gauge("relay_partitions_led", "Partitions this replica leads", registry=r)
        self.partitions_target = Gauge(
            "relay_partitions_target",
            "Partitions this replica should lead (its share of the live replicas; 1 without RELAY_PARTITIONS)",
            registry=r,
        )
        # `replica`, not `instance`: Prometheus sets `instance` to the scraped target.
        Info("relay", "This relay: replica (RELAY_INSTANCE_ID), outbox, version, partitions", registry=r).info(
            {"replica": replica, "outbox": outbox, "version": _version(), "partitions": str(partitions)}
        )
        prometheus_client.ProcessCollector(registry=r)

    def _published_series(self, r: CollectorRegistry) -> None:
        """What Kafka acknowledged, for all partitions together."""
        self.events = Counter("relay_events_published", "Events acknowledged by Kafka, by topic", ["topic"], registry=r)
        self.bytes = Counter(
            "relay_bytes_published", "Message value bytes acknowledged by Kafka, by topic", ["topic"], registry=r
        )
        self.batch_seconds = Histogram(
            "relay_batch_seconds", "From handing a batch to the producer until Kafka acknowledged all of it", registry=r
        )
        self.latency = BatchHistogram(
            "relay_delivery_latency_seconds",
            "Per event: from its commit in MongoDB (change event wallTime) to Kafka's acknowledgement",
            LATENCY_BUCKETS,
            r,
        )
        self.own_latency = BatchHistogram(
            "relay_read_to_ack_seconds",
            "Per event: from the relay reading its change to Kafka's "
            "acknowledgement (the relay's own share of the latency)",
            OWN_LATENCY_BUCKETS,
            r,
        )

    def _lease_series(self, r: CollectorRegistry) -> None:
        """The series about one lease: labelled `partition` when there are several."""
        by, of = (["partition"], ", by partition") if self.labelled else ([], "")
        label = by[0] if by else None
        self.batches = Counter("relay_batches", f"Batches acknowledged by Kafka{of}", by, registry=r)
        self.checkpoint_time = Gauge(
            "relay_checkpoint_cluster_time_seconds",
            f"Cluster time of the last checkpoint this replica stored (Unix seconds){of}",
            by,
            registry=r,
        )
        self.checkpoint_lag = ScrapeTimeGauge(
            "relay_checkpoint_lag_seconds",
            f"Now minus the cluster time of the stored checkpoint{of} (only where this replica holds the lease)",
            label,
            r,
        )
        self.lease_held = Gauge("relay_lease_held", f"1 while this replica holds the lease{of}", by, registry=r)
        self.fencing = Gauge(
            "relay_fencing_token", f"Fencing token of the held lease (0 when not held){of}", by, registry=r
        )
        self.producer_queue = ScrapeTimeGauge(
            "relay_producer_queue_messages", f"Messages in the producer awaiting a delivery report{of}", label, r
        )

    def _outcome_series(self, r: CollectorRegistry) -> None:
        """What happened to the loops: errors, restarts, dead letters, driver resumes."""
        self.errors = Counter(
            "relay_errors",
            "Errors by exception name and what the relay did (restart, standby, stop, dead-letter)",
            ["kind", "action"],
            registry=r,
        )
        self.restarts = Counter("relay_restarts", "Restarts from the checkpoint, by error kind", ["kind"], registry=r)
        self.dead_letters = Counter("relay_dead_letters", "Poison events sent to the dead-letter topic", registry=r)
        self.resumes = Counter(
            "relay_stream_resumes", "Change stream resumes by the change source after resumable errors", registry=r
        )

    def partition(
        self, index: int, checkpoint_lag: Callable[[], float | None], queued: Callable[[], float]
    ) -> PartitionMetrics:
        """Partition `index`'s view; `checkpoint_lag` and `queued` are read at scrape time."""
        return PartitionMetrics(self, str(index), checkpoint_lag, queued)


class PartitionMetrics:
    """One loop's view of `RelayMetrics`: its `partition` children bound here, once (the series
    themselves when they carry no label)."""

    def __init__(
        self,
        metrics: RelayMetrics,
        partition: str,
        checkpoint_lag: Callable[[], float | None],
        queued: Callable[[], float],
    ) -> None:
        def bound(series: Any) -> Any:
            return series.labels(partition) if metrics.labelled else series

        self.registry = metrics.registry
        self.events, self.bytes = metrics.events, metrics.bytes
        self.batch_seconds, self.latency, self.own_latency = metrics.batch_seconds, metrics.latency, metrics.own_latency
        self.batches = bound(metrics.batches)
        self.checkpoint_time = bound(metrics.checkpoint_time)
        self.lease_held = bound(metrics.lease_held)
        self.fencing = bound(metrics.fencing)
        self.errors, self.restarts = metrics.errors, metrics.restarts
        self.dead_letters, self.resumes = metrics.dead_letters, metrics.resumes
        metrics.checkpoint_lag.add(partition, checkpoint_lag)
        metrics.producer_queue.add(partition, queued)
        self._topics: dict[str, tuple[Any, Any]] = {}

    def count_published(self, messages: Iterable[Any]) -> int:
        """Add acknowledged messages to the per-topic event and byte counters (one counter update
        per topic, not per message); returns how many there were."""
        per_topic: dict[str, list[int]] = {}
        n = 0
        for m in messages:
            totals = per_topic.get(m.topic)
            if totals is None:
                totals = per_topic[m.topic] = [0, 0]
            totals[0] += 1
            totals[1] += len(m.value)
            n += 1
        for topic, (count, size) in per_topic.items():
            children = self._topics.get(topic)
            if children is None:
                children = self._topics[topic] = (self.events.labels(topic), self.bytes.labels(topic))
            children[0].inc(count)
            children[1].inc(size)
        return n


def _version() -> str:
    try:
        return importlib.metadata.version("outbox-relay")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

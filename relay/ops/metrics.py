"""Prometheus metrics of one relay: the series, and the collectors cheap on the hot path.

Every relay has its own registry, so several relays can run in one process (tests, the demo).
The README's Metrics table lists every series; names follow Prometheus conventions
(`relay_..._total`, `_seconds`, `_bytes`). There are no `_created` series.

A process that runs one relay per partition (RELAY_PARTITIONS > 1, relay.group.runner) has one registry
for all of them (`GroupMetrics`): the series about one lease (held, fencing token, checkpoint
time and lag, batches, producer queue) carry a `partition` label, bound once per partition
(`PartitionMetrics`), never looked up per event; the rest are shared.
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
    """A gauge computed when scraped; absent while `value()` returns None."""

    def __init__(
        self, name: str, documentation: str, value: Callable[[], float | None], registry: CollectorRegistry
    ) -> None:
        self._name, self._doc, self._value = name, documentation, value
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._doc)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self._name, self._doc)
        value = self._value()
        if value is not None:
            family.add_metric([], value)
        yield family


class LabeledScrapeTimeGauge(Collector):
    """A gauge computed when scraped, one sample per value of `label` (`add` registers each);
    a sample is absent while its function returns None."""

    def __init__(self, name: str, documentation: str, label: str, registry: CollectorRegistry) -> None:
        self._name, self._doc, self._label = name, documentation, label
        self._values: dict[str, Callable[[], float | None]] = {}
        registry.register(self)

    def add(self, label_value: str, value: Callable[[], float | None]) -> None:
        self._values[label_value] = value

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._doc, labels=[self._label])

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self._name, self._doc, labels=[self._label])
        for label_value, value in sorted(self._values.items(), key=lambda kv: int(kv[0])):
            v = value()
            if v is not None:
                family.add_metric([label_value], v)
        yield family


class _TopicCounting:
    """The acknowledged-delivery series (`_published_series`) and `count_published` over `events`
    and `bytes` (families labelled by topic)."""

    events: Counter
    bytes: Counter
    batch_seconds: Histogram
    latency: BatchHistogram
    own_latency: BatchHistogram
    _topics: dict[str, tuple[Any, Any]]

    def _published_series(self, r: CollectorRegistry) -> None:
        """The series of acknowledged deliveries, the same with or without partitions."""
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
        self._topics = {}

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


class RelayMetrics(_TopicCounting):
    """The series of one relay, in their own registry.

    `checkpoint_lag` and `queued` are read at scrape time (the lease holder's checkpoint lag; the
    messages the producer holds).
    """

    def __init__(
        self, replica: str, outbox: str, checkpoint_lag: Callable[[], float | None], queued: Callable[[], float]
    ) -> None:
        self.registry = r = CollectorRegistry()
        self._published_series(r)
        self.batches = Counter("relay_batches", "Batches acknowledged by Kafka", registry=r)
        self.checkpoint_time = Gauge(
            "relay_checkpoint_cluster_time_seconds",
            "Cluster time of the last checkpoint this replica stored (Unix seconds)",
            registry=r,
        )
        ScrapeTimeGauge(
            "relay_checkpoint_lag_seconds",
            "Now minus the cluster time of the stored checkpoint (only on the lease holder)",
            checkpoint_lag,
            r,
        )
        self.lease_held = Gauge("relay_lease_held", "1 while this replica holds the lease", registry=r)
        self.fencing = Gauge("relay_fencing_token", "Fencing token of the held lease (0 when not held)", registry=r)
        self.errors, self.restarts, self.dead_letters, self.resumes = _outcome_counters(r)
        self.producer_queue = Gauge(
            "relay_producer_queue_messages", "Messages in the producer awaiting a delivery report", registry=r
        )
        self.producer_queue.set_function(queued)
        # `replica`, not `instance`: Prometheus sets `instance` to the scraped target.
        Info("relay", "This relay: replica (RELAY_INSTANCE_ID), outbox, version", registry=r).info(
            {"replica": replica, "outbox": outbox, "version": _version()}
        )
        prometheus_client.ProcessCollector(registry=r)


def _outcome_counters(r: CollectorRegistry) -> tuple[Counter, Counter, Counter, Counter]:
    """The counters of what happened to the loop, the same with or without partitions: errors,
    restarts, dead letters, driver resumes."""
    return (
        Counter(
            "relay_errors",
            "Errors by exception name and what the relay did (restart, standby, stop, dead-letter)",
            ["kind", "action"],
            registry=r,
        ),
        Counter("relay_restarts", "Restarts from the checkpoint, by error kind", ["kind"], registry=r),
        Counter("relay_dead_letters", "Poison events sent to the dead-letter topic", registry=r),
        Counter("relay_stream_resumes", "Change stream resumes by the driver after resumable errors", registry=r),
    )


class GroupMetrics(_TopicCounting):
    """The series of a process running one relay per partition, in one registry (see the module
    docstring for which carry `partition`); `partition()` gives one partition's view."""

    def __init__(self, replica: str, outbox: str, partitions: int) -> None:
        self.registry = r = CollectorRegistry()
        self._published_series(r)
        self.batches = Counter(
            "relay_batches", "Batches acknowledged by Kafka, by partition", ["partition"], registry=r
        )
        self.checkpoint_time = Gauge(
            "relay_checkpoint_cluster_time_seconds",
            "Cluster time of the last checkpoint this replica stored (Unix seconds), by partition",
            ["partition"],
            registry=r,
        )
        self.checkpoint_lag = LabeledScrapeTimeGauge(
            "relay_checkpoint_lag_seconds",
            "Now minus the cluster time of the stored checkpoint, by partition (only where this replica leads)",
            "partition",
            r,
        )
        self.lease_held = Gauge(
            "relay_lease_held", "1 while this replica holds the partition's lease", ["partition"], registry=r
        )
        self.fencing = Gauge(
            "relay_fencing_token",
            "Fencing token of the partition's held lease (0 when not held)",
            ["partition"],
            registry=r,
        )
        self.errors, self.restarts, self.dead_letters, self.resumes = _outcome_counters(r)
        self.producer_queue = LabeledScrapeTimeGauge(
            "relay_producer_queue_messages",
            "Messages in the partition's producer awaiting a delivery report",
            "partition",
            r,
        )
        self.partitions_led = Gauge("relay_partitions_led", "Partitions this replica leads", registry=r)
        self.partitions_target = Gauge(
            "relay_partitions_target",
            "Partitions this replica should lead (its share of the live replicas)",
            registry=r,
        )
        Info("relay", "This relay: replica (RELAY_INSTANCE_ID), outbox, version, partitions", registry=r).info(
            {"replica": replica, "outbox": outbox, "version": _version(), "partitions": str(partitions)}
        )
        prometheus_client.ProcessCollector(registry=r)

    def partition(
        self, index: int, checkpoint_lag: Callable[[], float | None], queued: Callable[[], float]
    ) -> PartitionMetrics:
        return PartitionMetrics(self, str(index), checkpoint_lag, queued)


class PartitionMetrics(_TopicCounting):
    """One partition's view of `GroupMetrics`: the same attributes as `RelayMetrics`, with the
    `partition` children bound here, once."""

    def __init__(
        self,
        group: GroupMetrics,
        partition: str,
        checkpoint_lag: Callable[[], float | None],
        queued: Callable[[], float],
    ) -> None:
        self.registry = group.registry
        self.events, self.bytes = group.events, group.bytes
        self.batches = group.batches.labels(partition)
        self.batch_seconds, self.latency, self.own_latency = group.batch_seconds, group.latency, group.own_latency
        self.checkpoint_time = group.checkpoint_time.labels(partition)
        self.lease_held = group.lease_held.labels(partition)
        self.fencing = group.fencing.labels(partition)
        self.errors, self.restarts = group.errors, group.restarts
        self.dead_letters, self.resumes = group.dead_letters, group.resumes
        group.checkpoint_lag.add(partition, checkpoint_lag)
        group.producer_queue.add(partition, queued)
        self._topics = {}


def _version() -> str:
    try:
        return importlib.metadata.version("outbox-relay")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

"""Prometheus metrics of one relay process: the series, and the collectors cheap on the hot path.

A process runs one relay loop per scope it may lead (an outbox, or a partition of it) and keeps
all their series in one registry (`RelayMetrics`; every process has its own, so several can run in
one process: tests, the demo). Every series about what a loop does carries an `outbox` label (its
`database.collection`), and the series about one lease (held, fencing token, checkpoint time and
lag, batches, producer queue) a `partition` label too when RELAY_PARTITIONS > 1 (`Scope.labels` and
`relay.core.partitions.label_names`, the one
place that says which): an unpartitioned outbox's series have no `partition` label, as they never
had. Each loop's view (`LoopMetrics`) binds its children once, never per event. The README's
Metrics table lists every series; names follow Prometheus conventions (`relay_..._total`,
`_seconds`, `_bytes`). There are no `_created` series.
"""

from __future__ import annotations

import bisect
import importlib.metadata
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from relay.core.namespace import Namespace
from relay.core.partitions import Scope, label_names

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


_topic, _value = attrgetter("topic"), attrgetter("value")


def latencies(wall_ms: Iterable[int], acked: float) -> list[float]:
    """Seconds from each change's commit (its wallTime, Unix ms; -1: unknown, e.g. the synthetic
    changes of a rescan) to `acked` (Unix seconds), never negative: the clocks of MongoDB and the
    relay may differ."""
    return [(s if (s := acked - ms / 1000.0) > 0.0 else 0.0) for ms in wall_ms if ms >= 0]


class BatchHistogram:
    """One child of a `BatchHistograms` family: a histogram fed a batch of values at a time.

    `observe_many` places each value with one bisect into a local count list and adds the
    counts under one lock, where prometheus_client's `Histogram.observe` takes a lock and
    updates every bucket per value.
    """

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: Iterable[float]) -> int:
        """Add every value; returns how many there were. The values are sorted once, so each
        bucket's count is one bisect per bound (the per-value work stays in C)."""
        ordered = sorted(values)
        n = len(ordered)
        if n:
            # le: a value equal to a bound is in its bucket, so the values up to a bound end at
            # bisect_right; each bucket holds those past the previous bound.
            ends = [bisect.bisect_right(ordered, b) for b in self._bounds]
            counts = [e - s for s, e in zip([0, *ends], [*ends, n], strict=True)]
            total = sum(ordered)
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

    def buckets(self) -> tuple[list[tuple[str, float]], float]:
        """The cumulative buckets (`le`, count) and the sum, as Prometheus exposes them."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip((*[repr(b) for b in self._bounds], "+Inf"), counts, strict=False):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        return buckets, total


class BatchHistograms(Collector):
    """A histogram family fed by `BatchHistogram` children, one per value of its labels (`labels()`).
    Exposed exactly like a labelled prometheus_client `Histogram` (`_bucket`, `_sum`, `_count`)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name, self._doc, self._labels = name, documentation, list(labels)
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._children: dict[tuple[str, ...], BatchHistogram] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: str) -> BatchHistogram:
        with self._lock:
            child = self._children.get(values)
            if child is None:
                child = self._children[values] = BatchHistogram(self._bounds)
            return child

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._doc, labels=self._labels)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labels)
        with self._lock:
            children = sorted(self._children.items())
        for values, child in children:
            buckets, total = child.buckets()
            family.add_metric(list(values), buckets, total)
        yield family


class ScrapeTimeGauge(Collector):
    """A gauge computed when scraped: one sample per function `add`ed, labelled with its values of
    `labels`. A sample is absent while its function returns None."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str], registry: CollectorRegistry) -> None:
        self._name, self._doc = name, documentation
        self._labels = list(labels)
        self._values: dict[tuple[str, ...], Callable[[], float | None]] = {}
        registry.register(self)

    def add(self, label_values: Sequence[str], value: Callable[[], float | None]) -> None:
        """Sample `value()` at scrape time, as `label_values`."""
        self._values[tuple(label_values)] = value

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._doc, labels=self._labels)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self._name, self._doc, labels=self._labels)
        for label_values, value in sorted(self._values.items()):
            v = value()
            if v is not None:
                family.add_metric(list(label_values), v)
        yield family


class RelayMetrics:
    """The series of one relay process, in their own registry (see the module docstring);
    `loop()` gives each loop its view."""

    def __init__(self, replica: str, outboxes: Sequence[Namespace], partitions: int, broker: str = "kafka") -> None:
        self.registry = r = CollectorRegistry()
        self.lease_labels = label_names(partitions)
        self.broker = broker  # the `broker` label of every series about publishing (RELAY_BROKER)
        self._published_series(r)
        self._lease_series(r)
        self._outcome_series(r)
        self.partitions_led = Gauge(
            "relay_partitions_led", "Leases this replica leads (every outbox, every partition)", registry=r
        )
        self.partitions_target = Gauge(
            "relay_partitions_target",
            "Leases this replica should lead (its share of the live replicas; all of them without RELAY_PARTITIONS)",
            registry=r,
        )
        # `replica`, not `instance`: Prometheus sets `instance` to the scraped target.
        Info(
            "relay", "This relay: replica (RELAY_INSTANCE_ID), outbox(es), version, partitions, broker", registry=r
        ).info(
            {
                "replica": replica,
                "outbox": ",".join(str(n) for n in outboxes),
                "version": _version(),
                "partitions": str(partitions),
                "broker": broker,
            }
        )
        prometheus_client.ProcessCollector(registry=r)

    def _published_series(self, r: CollectorRegistry) -> None:
        """What the broker acknowledged, by outbox (and `broker`: RELAY_BROKER)."""
        self.events = Counter(
            "relay_events_published",
            "Events acknowledged by the broker, by outbox and topic (a NATS subject, a RabbitMQ routing key)",
            ["outbox", "topic", "broker"],
            registry=r,
        )
        self.bytes = Counter(
            "relay_bytes_published",
            "Message value bytes acknowledged by the broker, by outbox and topic",
            ["outbox", "topic", "broker"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "relay_batch_seconds",
            "From handing a batch to the producer until the broker acknowledged all of it, by outbox",
            ["outbox", "broker"],
            registry=r,
        )
        self.latency = BatchHistograms(
            "relay_delivery_latency_seconds",
            "Per event: from its commit in MongoDB (change event wallTime) to the broker's acknowledgement, by outbox",
            ["outbox", "broker"],
            LATENCY_BUCKETS,
            r,
        )
        self.own_latency = BatchHistograms(
            "relay_read_to_ack_seconds",
            "Per event: from the relay reading its change to the broker's "
            "acknowledgement (the relay's own share of the latency), by outbox",
            ["outbox", "broker"],
            OWN_LATENCY_BUCKETS,
            r,
        )

    def _lease_series(self, r: CollectorRegistry) -> None:
        """The series about one lease (`lease_labels`)."""
        by = self.lease_labels
        of = ", by " + " and ".join(by)
        self.batches = Counter("relay_batches", f"Batches acknowledged by the broker{of}", [*by, "broker"], registry=r)
        self.checkpoint_time = Gauge(
            "relay_checkpoint_cluster_time_seconds",
            f"Cluster time of the last checkpoint this replica stored (Unix seconds){of}",
            by,
            registry=r,
        )
        self.checkpoint_lag = ScrapeTimeGauge(
            "relay_checkpoint_lag_seconds",
            f"Now minus the cluster time of the stored checkpoint{of} (only where this replica holds the lease)",
            by,
            r,
        )
        self.lease_held = Gauge("relay_lease_held", f"1 while this replica holds the lease{of}", by, registry=r)
        self.fencing = Gauge(
            "relay_fencing_token", f"Fencing token of the held lease (0 when not held){of}", by, registry=r
        )
        self.producer_queue = ScrapeTimeGauge(
            "relay_producer_queue_messages",
            f"Messages in the producer awaiting the broker's acknowledgement{of}",
            [*by, "broker"],
            r,
        )

    def _outcome_series(self, r: CollectorRegistry) -> None:
        """What happened to the loops (`lease_labels`): errors, restarts, dead letters, stream resumes.
        Errors of the process itself (a failed start) carry the outbox `-`."""
        by = self.lease_labels
        self.errors = Counter(
            "relay_errors",
            "Errors by outbox, exception name and what the relay did (restart, standby, stop, dead-letter)",
            [*by, "kind", "action"],
            registry=r,
        )
        self.restarts = Counter(
            "relay_restarts", "Restarts from the checkpoint, by outbox and error kind", [*by, "kind"], registry=r
        )
        self.dead_letters = Counter(
            "relay_dead_letters", "Poison events sent to the dead-letter topic, by outbox", by, registry=r
        )
        self.resumes = Counter(
            "relay_stream_resumes",
            "Change stream resumes after resumable errors (counted by each loop the stream serves), by outbox",
            by,
            registry=r,
        )

    def process_error(self, kind: str) -> None:
        """The process stops on `kind` before any loop ran (the start-up checks)."""
        self.errors.labels(*["-"] * len(self.lease_labels), kind, "stop").inc()

    def loop(
        self, scope: Scope, checkpoint_lag: Callable[[], float | None], queued: Callable[[], float]
    ) -> LoopMetrics:
        """The view of `scope`'s loop; `checkpoint_lag` and `queued` are read at scrape time."""
        return LoopMetrics(self, scope, checkpoint_lag, queued)


class LoopMetrics:
    """One loop's view of `RelayMetrics`: its children bound here, once."""

    def __init__(
        self,
        metrics: RelayMetrics,
        scope: Scope,
        checkpoint_lag: Callable[[], float | None],
        queued: Callable[[], float],
    ) -> None:
        outbox, self._lease = str(scope.namespace), scope.labels
        self.registry = metrics.registry
        self._outbox, broker = outbox, metrics.broker
        self._broker = broker
        self._events, self._bytes = metrics.events, metrics.bytes
        self.batch_seconds = metrics.batch_seconds.labels(outbox, broker)
        self.latency = metrics.latency.labels(outbox, broker)
        self.own_latency = metrics.own_latency.labels(outbox, broker)
        self.batches = metrics.batches.labels(*self._lease, broker)
        self.checkpoint_time = metrics.checkpoint_time.labels(*self._lease)
        self.lease_held = metrics.lease_held.labels(*self._lease)
        self.fencing = metrics.fencing.labels(*self._lease)
        self._errors, self._restarts = metrics.errors, metrics.restarts
        self.dead_letters = metrics.dead_letters.labels(*self._lease)
        self.resumes = metrics.resumes.labels(*self._lease)
        metrics.checkpoint_lag.add(self._lease, checkpoint_lag)
        metrics.producer_queue.add([*self._lease, broker], queued)
        self._topics: dict[str, tuple[Any, Any]] = {}
        self._labels = dict(zip(metrics.lease_labels, self._lease, strict=True))

    def error(self, kind: str, action: str) -> None:
        self._errors.labels(*self._lease, kind, action).inc()

    def restart(self, kind: str) -> None:
        self._restarts.labels(*self._lease, kind).inc()

    def count_published(self, messages: Iterable[Any]) -> int:
        """Add acknowledged messages to the per-topic event and byte counters (one counter update
        per topic, not per message); returns how many there were."""
        per_topic: dict[str, list[int]] = {}
        n = 0
        for topic, group in itertools.groupby(messages, _topic):  # runs of one topic, in C
            values = list(map(_value, group))
            totals = per_topic.get(topic)
            if totals is None:
                totals = per_topic[topic] = [0, 0]
            totals[0] += len(values)
            totals[1] += sum(map(len, values))
            n += len(values)
        for topic, (count, size) in per_topic.items():
            children = self._topics.get(topic)
            if children is None:
                children = self._topics[topic] = (
                    self._events.labels(self._outbox, topic, self._broker),
                    self._bytes.labels(self._outbox, topic, self._broker),
                )
            children[0].inc(count)
            children[1].inc(size)
        return n

    def totals(self) -> dict[str, float]:
        """This loop's counts for the summary line, read from the registry's series (each summed
        over its other labels): `published` (this outbox's events, every partition), `batches`,
        `restarts`, `dead_letters`, `errors`."""
        wanted = {
            "relay_events_published": ("published", {"outbox": self._outbox}),
            "relay_batches": ("batches", self._labels),
            "relay_restarts": ("restarts", self._labels),
            "relay_dead_letters": ("dead_letters", self._labels),
            "relay_errors": ("errors", self._labels),
        }
        sums = dict.fromkeys(("published", "batches", "restarts", "dead_letters", "errors"), 0.0)
        for family in self.registry.collect():
            if family.name not in wanted:
                continue
            key, labels = wanted[family.name]
            for sample in family.samples:
                if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
                    sums[key] += sample.value
        return sums


def _version() -> str:
    try:
        return importlib.metadata.version("outbox-relay")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

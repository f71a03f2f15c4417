"""Wiring: the relay with its real boundaries; the one place that reads the whole Settings.

`build` is what `outbox-relay run`, the demo, the tests and the benchmarks call: the process's
`Group` (relay.group.runner), running one `Relay` loop per partition of the outbox; without
RELAY_PARTITIONS that is a group of one partition, wired the same way. Each part gets its own
configuration (`Settings.parts()`), never the settings themselves. This is the only place that
builds clients for the loop; the loop itself (`relay.core.loop.Relay`) never builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from pymongo import MongoClient

from relay.avro.encoding import MessageBuilder
from relay.avro.folder import SchemaFolder
from relay.avro.framing import Framing, framing_for
from relay.config import PartConfigs, Settings
from relay.core.boundaries import Assignment
from relay.core.errors import first_of
from relay.core.loop import Relay
from relay.core.partitions import Partition, lease_id, partitions
from relay.group.balance import Balance, PartitionAssignment
from relay.group.runner import Group
from relay.kafka import errors as kafka_errors
from relay.kafka.admin import check_kafka
from relay.kafka.modes import AtLeastOnce, ExactlyOnce
from relay.kafka.offsets_topic import OffsetsTopic
from relay.kafka.producer import check_config
from relay.kafka.transactions import check_transactional_config
from relay.mongo import errors as mongo_errors
from relay.mongo.changes import ChangeSource
from relay.mongo.connection import check_mongodb, mongo_client
from relay.mongo.housekeeping import Housekeeper, cleaner_for, shares_of
from relay.mongo.membership import Membership
from relay.mongo.pipeline import pipeline, pipeline_fingerprint, scan_filter
from relay.mongo.privileges import check as check_privileges
from relay.mongo.privileges import required_for
from relay.mongo.repartition import check_server, prepare
from relay.ops.health import Health
from relay.ops.observe import PartitionObserver, ProcessObserver
from relay.ops.outbox_checks import OutboxMetrics

# What the loop does with the drivers' exceptions (relay.core.errors.classify).
DRIVER_ERRORS = first_of(mongo_errors.action_for, kafka_errors.action_for)


def build(settings: Settings, folder: SchemaFolder | None = None, native: bool = True) -> Group:
    """The relay process for `settings`: a group of RELAY_PARTITIONS relay loops (one without
    partitions) sharing one MongoDB client, with the group's heartbeat (membership),
    housekeeping and start-up checks (`_preflight`), which `Group.run()` runs first. It has
    `run()`, `stop()` and `observer` (with its metrics `registry` and `serve()`)."""
    parts = settings.parts()
    mongo, count = parts.mongo, parts.group.partitions
    client = mongo_client(mongo)
    folder = folder or SchemaFolder.bundled()
    observer = ProcessObserver(parts.observer)
    balance = Balance(count)
    relays = [
        (
            p,
            _partition_relay(
                parts, p, client, observer.partition(p), folder, native, PartitionAssignment(balance, p.index)
            ),
        )
        for p in partitions(count)
    ]
    shares = shares_of(mongo.namespace, count, parts.encoding.fields.aggregate_id)
    housekeeper = housekeeping(parts, client, shares, observer.metrics.registry, observer.health)

    def start() -> None:
        _preflight(parts, client)
        housekeeper.start()

    def close() -> None:
        housekeeper.stop()
        client.close()

    g = parts.group
    leases = client[mongo.database][mongo.lease_collection]
    membership = Membership(leases, mongo.namespace, g.instance_id, count, g.timing.lease_ttl_s)
    return Group(g, relays, balance, membership, observer, start, close)


def message_builder(
    settings: Settings | PartConfigs,
    folder: SchemaFolder | None = None,
    framing: Framing | None = None,
    native: bool = True,
) -> MessageBuilder:
    """The message builder over `folder` (default: the bundled schemas/), with `framing` or the one
    the settings select; `native=False` builds every message in Python, for comparisons."""
    parts = settings.parts() if isinstance(settings, Settings) else settings
    folder = folder or SchemaFolder.bundled()
    return MessageBuilder(parts.encoding, folder, framing or framing_for(parts.registry, folder), native=native)


def _partition_relay(
    parts: PartConfigs,
    partition: Partition,
    client: MongoClient[Any],
    observer: PartitionObserver,
    folder: SchemaFolder,
    native: bool,
    assignment: Assignment,
) -> Relay[PartitionObserver]:
    """The relay loop of one partition (the whole outbox without partitions) on the process's
    `client`: its lease, change source, delivery mode, message builder and assignment."""
    lid = lease_id(parts.mongo.namespace, partition)
    source, fingerprint = _change_source(parts, client, partition)
    return Relay(
        parts.loop,
        source=source,
        mode=delivery_mode(parts, lid, fingerprint),
        lease=parts.lease_store(client, partition),
        encoder=message_builder(parts, folder, native=native),
        observer=observer,
        fingerprint=fingerprint,
        assignment=assignment,
        foreign_errors=DRIVER_ERRORS,
    )


def _change_source(
    parts: PartConfigs, client: MongoClient[Any], partition: Partition
) -> tuple[Callable[[], ChangeSource], str]:
    """The change source factory of `partition` and the fingerprint of its pipeline."""
    mongo, fields = parts.mongo, parts.encoding.fields
    stages = pipeline(partition, fields.aggregate_id)
    documents = scan_filter(partition, fields.aggregate_id)
    outbox = client[mongo.database][mongo.outbox_collection]

    def source() -> ChangeSource:
        return ChangeSource(outbox, mongo.max_await_ms, fields.occurred_at, pipeline=stages, scan_filter=documents)

    return source, pipeline_fingerprint(mongo.namespace, stages)


def delivery_mode(parts: PartConfigs, lid: str, fingerprint: str) -> AtLeastOnce | ExactlyOnce:
    """The delivery mode of lease `lid` (RELAY_DELIVERY): the producer of each leading session and
    the lease's offsets record (relay.kafka.modes)."""
    kafka = parts.kafka
    offsets = OffsetsTopic(kafka)
    if kafka.exactly_once:
        return ExactlyOnce(kafka, lid, fingerprint, offsets)
    return AtLeastOnce(kafka, lid, offsets)


def _preflight(parts: PartConfigs, client: MongoClient[Any]) -> None:
    """The process's start-up checks: librdkafka accepts the configuration (each lease's
    transactional producer, in exactly-once mode); MongoDB answers, the user holds the privileges
    the mode needs and the server can compute partitions; the partition count did not change
    under running relays (or the outbox moves to it: relay.mongo.repartition); every partition's
    lease document exists; Kafka answers (and, in exactly-once mode, the offsets topic exists,
    compacted)."""
    mongo, kafka, count = parts.mongo, parts.kafka, parts.group.partitions
    if kafka.exactly_once:
        for p in partitions(count):
            check_transactional_config(kafka, lease_id(mongo.namespace, p))
    else:
        check_config(kafka.producer_config())
    check_mongodb(client, mongo)
    check_privileges(client, required_for(mongo, parts.cleanup))
    check_server(client[mongo.database][mongo.outbox_collection], count)
    prepare(client[mongo.database][mongo.lease_collection], mongo.namespace, count)
    for p in partitions(count):  # so a later change of count finds all of them
        parts.lease_store(client, p).ensure()
    check_kafka(kafka)
    if kafka.exactly_once:
        OffsetsTopic(kafka).ensure()


def housekeeping(
    parts: PartConfigs,
    client: MongoClient[Any],
    shares: Sequence[tuple[str, Mapping[str, Any] | None]],
    registry: CollectorRegistry,
    health: Health,
) -> Housekeeper:
    """The outbox checks and clean-up by position (relay.mongo.housekeeping) of one process, over
    the lease ids (with their documents) it may lead, reporting to its metrics and health."""
    mongo = parts.mongo
    cleaner = cleaner_for(client, mongo, parts.encoding.fields.occurred_at, parts.cleanup)
    report = OutboxMetrics(registry, health)
    leases = client[mongo.database][mongo.lease_collection]
    return Housekeeper(cleaner, leases, parts.group.instance_id, shares, parts.cleanup, report)

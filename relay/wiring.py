"""Wiring: the relay with its real boundaries; the one place that reads the whole Settings.

`build` is what `outbox-relay run`, the demo, the tests and the benchmarks call: one `Relay`
for the whole outbox (RELAY_PARTITIONS=1), or a `Group` running one per partition. Each part gets
its own configuration (`Settings.parts()`), never the settings themselves. Those are the only
places that build clients for the loop; the loop itself (`relay.core.loop.Relay`) never builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from pymongo import MongoClient

from relay.avro.encoding import MessageBuilder
from relay.avro.folder import SchemaFolder
from relay.avro.framing import Framing, framing_for
from relay.config import Parts, Settings
from relay.core.boundaries import ALWAYS, Assignment
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
from relay.ops.health import GroupHealth, Health
from relay.ops.observe import GroupObserver, Observer
from relay.ops.outbox_checks import OutboxMetrics

# What the loop does with the drivers' exceptions (relay.core.errors.classify).
DRIVER_ERRORS = first_of(mongo_errors.action_for, kafka_errors.action_for)


def build(
    settings: Settings, observer: Observer | None = None, folder: SchemaFolder | None = None, native: bool = True
) -> Relay[Observer] | Group:
    """What runs the outbox: `build_relay` when RELAY_PARTITIONS is 1, else `build_group`.
    Either has `run()`, `stop()` and `observer` (with its metrics `registry`)."""
    if settings.parts().group.partitions == 1:
        return build_relay(settings, observer, folder, native=native)
    return build_group(settings, folder, native=native)


def message_builder(
    settings: Settings | Parts, folder: SchemaFolder | None = None, framing: Framing | None = None, native: bool = True
) -> MessageBuilder:
    """The message builder over `folder` (default: the bundled schemas/), with `framing` or the one
    the settings select; `native=False` builds every message in Python, for comparisons."""
    parts = settings.parts() if isinstance(settings, Settings) else settings
    folder = folder or SchemaFolder.bundled()
    return MessageBuilder(parts.encoding, folder, framing or framing_for(parts.registry, folder), native=native)


def build_relay(
    settings: Settings,
    observer: Observer | None = None,
    folder: SchemaFolder | None = None,
    *,
    native: bool = True,
    partition: Partition | None = None,
    client: MongoClient[Any] | None = None,
    assignment: Assignment = ALWAYS,
) -> Relay[Observer]:
    """A relay for `settings`: its MongoDB client, lease, change source, delivery mode, message
    builder and start-up checks (`_own_hooks`), which `Relay.run()` runs first. For one partition
    of a group (`partition`, from `build_group`): the group's `client`, which the group checks and
    closes, and the partition's lease, pipeline and assignment.
    """
    parts = settings.parts()
    mongo = parts.mongo
    own_client = client is None
    client = mongo_client(mongo) if client is None else client
    lid = lease_id(mongo.namespace, partition)
    source, documents, fingerprint = _change_source(parts, client, partition)
    producers = delivery_mode(parts, lid, fingerprint)
    observer = observer or Observer(parts.observer)
    # A group's partitions share the group's client, checks and housekeeping.
    preflight, close = (
        _own_hooks(parts, client, producers, (lid, documents), observer) if own_client else (_nothing, _nothing)
    )
    return Relay(
        parts.loop,
        source=source,
        producers=producers,
        lease=parts.lease_store(client, partition),
        encoder=message_builder(parts, folder, native=native),
        observer=observer,
        fingerprint=fingerprint,
        preflight=preflight,
        close=close,
        assignment=assignment,
        foreign_errors=DRIVER_ERRORS,
    )


def _change_source(
    parts: Parts, client: MongoClient[Any], partition: Partition | None
) -> tuple[Callable[[], ChangeSource], Mapping[str, Any] | None, str]:
    """The change source factory of `partition` (None: the whole outbox), the filter of the
    documents a rescan serves, and the fingerprint of its pipeline."""
    mongo, fields = parts.mongo, parts.encoding.fields
    stages = pipeline(partition, fields.aggregate_id)
    documents = scan_filter(partition, fields.aggregate_id)
    outbox = client[mongo.database][mongo.outbox_collection]

    def source() -> ChangeSource:
        return ChangeSource(outbox, mongo.max_await_ms, fields.occurred_at, pipeline=stages, scan_filter=documents)

    return source, documents, pipeline_fingerprint(mongo.namespace, stages)


def delivery_mode(parts: Parts, lid: str, fingerprint: str) -> AtLeastOnce | ExactlyOnce:
    """The delivery mode of lease `lid` (RELAY_DELIVERY): the producer of each leading session and
    the lease's offsets record (relay.kafka.modes)."""
    kafka = parts.kafka
    offsets = OffsetsTopic(kafka)
    if kafka.exactly_once:
        return ExactlyOnce(kafka, lid, fingerprint, offsets)
    return AtLeastOnce(kafka, lid, offsets)


def _nothing() -> None:
    pass


def _own_hooks(
    parts: Parts,
    client: MongoClient[Any],
    producers: AtLeastOnce | ExactlyOnce,
    share: tuple[str, Mapping[str, Any] | None],
    observer: Observer,
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(preflight, close) of a relay with a client of its own. Start-up checks: librdkafka accepts
    the configuration; MongoDB and Kafka answer; the partition count did not change under running
    relays; in exactly-once mode the offsets topic exists, compacted. Then its housekeeping
    starts; at the end, housekeeping stops and the client closes."""
    mongo, kafka = parts.mongo, parts.kafka
    housekeeper = housekeeping(parts, client, [share], observer.metrics.registry, observer.health)

    def preflight() -> None:
        producers.check()
        check_mongodb(client, mongo)
        check_privileges(client, required_for(mongo, parts.cleanup, parts.group.partitions))
        prepare(client[mongo.database][mongo.lease_collection], mongo.namespace, parts.group.partitions)
        check_kafka(kafka)
        if kafka.exactly_once:
            OffsetsTopic(kafka).ensure()
        housekeeper.start()

    def close() -> None:
        housekeeper.stop()
        client.close()

    return preflight, close


def build_group(settings: Settings, folder: SchemaFolder | None = None, native: bool = True) -> Group:
    """A group of RELAY_PARTITIONS relays sharing one MongoDB client (relay.group.runner.Group),
    with its heartbeat (membership), housekeeping and start-up checks (`_group_preflight`)."""
    parts = settings.parts()
    mongo = parts.mongo
    client = mongo_client(mongo)
    leases = client[mongo.database][mongo.lease_collection]
    folder = folder or SchemaFolder.bundled()
    observer = GroupObserver(parts.observer)
    count = parts.group.partitions
    balance = Balance(count)

    def relay_of(p: Partition) -> Relay[Observer]:
        assignment = PartitionAssignment(balance, p.index)
        return build_relay(
            settings, observer.partition(p), folder, native=native, partition=p, client=client, assignment=assignment
        )

    relays = [(p, relay_of(p)) for p in partitions(count)]

    shares = shares_of(mongo.namespace, count, parts.encoding.fields.aggregate_id)
    housekeeper = housekeeping(parts, client, shares, observer.metrics.registry, observer.health)

    def start() -> None:
        _group_preflight(parts, client)
        housekeeper.start()

    def close() -> None:
        housekeeper.stop()
        client.close()

    g = parts.group
    membership = Membership(leases, mongo.namespace, g.instance_id, count, g.lease_ttl_s)
    return Group(g, relays, balance, membership, observer, start, close)


def _group_preflight(parts: Parts, client: MongoClient[Any]) -> None:
    """A group's start-up checks: librdkafka accepts the configuration, MongoDB answers and can
    compute partitions, the partition count did not change under running relays (or the outbox
    moves to it: relay.mongo.repartition), every partition's lease document exists, Kafka answers
    (and, in exactly-once mode, the offsets topic exists, compacted)."""
    mongo, kafka, count = parts.mongo, parts.kafka, parts.group.partitions
    if kafka.exactly_once:
        for p in partitions(count):
            check_transactional_config(kafka, lease_id(mongo.namespace, p))
    else:
        check_config(kafka.producer_config())
    check_mongodb(client, mongo)
    check_privileges(client, required_for(mongo, parts.cleanup, count))
    check_server(client[mongo.database][mongo.outbox_collection], count)
    prepare(client[mongo.database][mongo.lease_collection], mongo.namespace, count)
    for p in partitions(count):  # so a later change of count finds all of them
        parts.lease_store(client, p).ensure()
    check_kafka(kafka)
    if kafka.exactly_once:
        OffsetsTopic(kafka).ensure()


def housekeeping(
    parts: Parts,
    client: MongoClient[Any],
    shares: Sequence[tuple[str, Mapping[str, Any] | None]],
    registry: CollectorRegistry,
    health: Health | GroupHealth,
) -> Housekeeper:
    """The outbox checks and clean-up by position (relay.mongo.housekeeping) of one process, over
    the lease ids (with their documents) it may lead, reporting to its metrics and health."""
    mongo = parts.mongo
    cleaner = cleaner_for(client, mongo, parts.encoding.fields.occurred_at, parts.cleanup)
    report = OutboxMetrics(registry, health)
    leases = client[mongo.database][mongo.lease_collection]
    return Housekeeper(cleaner, leases, parts.group.instance_id, shares, parts.cleanup, report)

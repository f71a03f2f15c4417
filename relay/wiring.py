"""Wiring: the relay with its real boundaries; the one place that reads the whole Settings.

`build` is what `outbox-relay run`, the demo, the tests and the benchmarks call: one `Relay`
for the whole outbox (RELAY_PARTITIONS=1), or a `Group` running one per partition. Each part gets
its own configuration (`Settings.parts()`), never the settings themselves. Those are the only
places that build clients for the loop; the loop itself (`relay.core.loop.Relay`) never builds one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from relay.mongo.lease import LeaseStore
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
    if settings.partitions == 1:
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
    """A relay for `settings`: its MongoDB client (closed when the relay stops), lease document,
    change source factory, delivery mode (relay.kafka.modes: the producer of each leading session
    and where it resumes), the message builder, and start-up checks (librdkafka accepts the
    configuration; MongoDB and Kafka answer; the partition count did not change under running
    relays; in exactly-once mode the offsets topic exists, compacted) that run first in `Relay.run()`.

    For one partition of a group (`partition`, built by `build_group`): the group's `client`
    (the group checks and closes it), the partition's lease, pipeline and assignment.
    """
    parts = settings.parts()
    mongo, kafka = parts.mongo, parts.kafka
    own_client = client is None
    client = mongo_client(mongo) if client is None else client
    db = client[mongo.database]
    outbox = db[mongo.outbox_collection]
    leases = db[mongo.lease_collection]
    lid = lease_id(mongo.namespace, partition)
    lease = LeaseStore(
        leases,
        lid,
        settings.instance_id,
        settings.lease_ttl_s,
        partition=partition,
        namespace=mongo.namespace,
        delivery=kafka.delivery,
    )
    stages = pipeline(partition, parts.encoding.fields.aggregate_id)
    documents = scan_filter(partition, parts.encoding.fields.aggregate_id)
    fingerprint = pipeline_fingerprint(mongo.namespace, stages)
    offsets = OffsetsTopic(kafka)
    producers: AtLeastOnce | ExactlyOnce = (
        ExactlyOnce(kafka, lid, fingerprint, offsets, parts.loop.start_at)
        if kafka.exactly_once
        else AtLeastOnce(kafka, lid, fingerprint, offsets)
    )

    observer = observer or Observer(parts.observer)

    def nothing() -> None:
        pass

    # One process measures and cleans up its outbox once: a group's partitions share the group's.
    housekeeper = (
        housekeeping(parts, client, [(lid, documents)], observer.metrics.registry, observer.health)
        if own_client
        else None
    )

    def preflight() -> None:
        producers.check()
        check_mongodb(client, mongo)
        check_privileges(client, required_for(mongo, parts.cleanup, settings.partitions))
        prepare(leases, mongo.namespace, settings.partitions)
        check_kafka(kafka)
        if kafka.exactly_once:
            offsets.ensure()
        if housekeeper is not None:
            housekeeper.start()

    def close() -> None:
        if housekeeper is not None:
            housekeeper.stop()
        client.close()

    return Relay(
        parts.loop,
        source=lambda: ChangeSource(
            outbox, mongo.max_await_ms, parts.encoding.fields.occurred_at, pipeline=stages, scan_filter=documents
        ),
        producers=producers,
        lease=lease,
        encoder=message_builder(parts, folder, native=native),
        observer=observer,
        fingerprint=fingerprint,
        preflight=preflight if own_client else nothing,
        close=close if own_client else nothing,
        assignment=assignment,
        foreign_errors=DRIVER_ERRORS,
    )


def build_group(settings: Settings, folder: SchemaFolder | None = None, native: bool = True) -> Group:
    """A group of RELAY_PARTITIONS relays sharing one MongoDB client (relay.group.runner.Group),
    with its heartbeat, and start-up checks: librdkafka accepts the configuration, MongoDB answers
    and can compute partitions, the partition count did not change under running relays (or the
    outbox moves to it: relay.mongo.repartition), every partition's lease document exists, Kafka
    answers (and, in exactly-once mode, the offsets topic exists, compacted)."""
    parts = settings.parts()
    mongo, kafka = parts.mongo, parts.kafka
    client = mongo_client(mongo)
    db = client[mongo.database]
    leases = db[mongo.lease_collection]
    folder = folder or SchemaFolder.bundled()
    observer = GroupObserver(parts.observer)
    balance = Balance(settings.partitions)
    relays = [
        (
            p,
            build_relay(
                settings,
                observer.partition(p),
                folder,
                native=native,
                partition=p,
                client=client,
                assignment=PartitionAssignment(balance, p.index),
            ),
        )
        for p in partitions(settings.partitions)
    ]

    def preflight() -> None:
        if kafka.exactly_once:
            for p in partitions(settings.partitions):
                check_transactional_config(kafka, lease_id(mongo.namespace, p))
        else:
            check_config(kafka.producer_config())
        check_mongodb(client, mongo)
        check_privileges(client, required_for(mongo, parts.cleanup, settings.partitions))
        check_server(db[mongo.outbox_collection], settings.partitions)
        prepare(leases, mongo.namespace, settings.partitions)
        for p in partitions(settings.partitions):  # so a later change of count finds all of them
            LeaseStore(
                leases,
                lease_id(mongo.namespace, p),
                settings.instance_id,
                settings.lease_ttl_s,
                partition=p,
                namespace=mongo.namespace,
                delivery=kafka.delivery,
            ).ensure()
        check_kafka(kafka)
        if kafka.exactly_once:
            OffsetsTopic(kafka).ensure()

    shares = shares_of(mongo.namespace, settings.partitions, parts.encoding.fields.aggregate_id)
    housekeeper = housekeeping(parts, client, shares, observer.metrics.registry, observer.health)

    def start() -> None:
        preflight()
        housekeeper.start()

    def close() -> None:
        housekeeper.stop()
        client.close()

    membership = Membership(leases, mongo.namespace, settings.instance_id, settings.partitions, settings.lease_ttl_s)
    return Group(parts.group, relays, balance, membership, observer, start, close)


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

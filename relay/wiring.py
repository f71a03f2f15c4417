"""Wiring: the relay with its real boundaries (pymongo, confluent-kafka, the lease document).

`build` is what `outbox-relay run`, the demo, the tests and the benchmarks call: one `Relay`
for the whole outbox (RELAY_PARTITIONS=1), or a `Group` running one per partition. Those are
the only places that build clients for the loop; the loop itself (`relay.relay.Relay`) never
builds one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymongo import MongoClient

from relay.boundaries import ALWAYS, Assignment, Publisher as PublisherBoundary, ResumePoint
from relay.changes import ChangeSource, pipeline, pipeline_fingerprint
from relay.config import Settings
from relay.connections import check_kafka, check_mongodb, mongo_client
from relay.encoding import MessageBuilder, SchemaFolder
from relay.group import Balance, Group, PartitionAssignment
from relay.lease import Checkpoint, Grant, LeaseStore
from relay.membership import Membership
from relay.observe import GroupObserver, Observer
from relay.partitioning import Partition, lease_id, partition_predicate, partitions
from relay.publisher import Publisher, check_config
from relay.relay import Relay
from relay.repartition import check_server, prepare
from relay.transactions import OffsetsTopic, TransactionalPublisher, check_transactional_config


def build(settings: Settings, observer: Observer | None = None, folder: SchemaFolder | None = None,
          native: bool = True) -> Relay | Group:
    """What runs the outbox: `build_relay` when RELAY_PARTITIONS is 1, else `build_group`.
    Either has `run()`, `stop()` and `observer` (with its metrics `registry`)."""
    if settings.partitions == 1:
        return build_relay(settings, observer, folder, native=native)
    return build_group(settings, folder, native=native)


def build_relay(settings: Settings, observer: Observer | None = None, folder: SchemaFolder | None = None,
                *, native: bool = True, partition: Partition | None = None,
                client: MongoClient[Any] | None = None, assignment: Assignment = ALWAYS) -> Relay:
    """A relay for `settings`: its MongoDB client (closed when the relay stops), lease document,
    change source and producer factories, the message builder over `folder` (default: the bundled
    schemas/; `native=False` builds every message in Python, for comparisons), and start-up checks
    (librdkafka accepts the configuration; MongoDB and Kafka answer; the partition count did not
    change under running relays; in exactly-once mode the offsets topic exists, compacted) that
    run first in `Relay.run()`.

    RELAY_DELIVERY picks the producer and the resume point: at-least-once, the idempotent
    producer and the lease document's checkpoint (or, right after an exactly-once run, the newer
    of it and the offsets topic's record); exactly-once, a transactional producer per leading
    session (relay.transactions), which fences earlier ones and resumes after the newer of the
    two. Both are per lease, so with partitions each partition has its own.

    For one partition of a group (`partition`, built by `build_group`): the group's `client`
    (the group checks and closes it), the partition's lease, pipeline and assignment.
    """
    s = settings
    own_client = client is None
    client = mongo_client(s) if client is None else client
    db = client[s.database]
    outbox = db[s.outbox_collection]
    leases = db[s.lease_collection]
    lease = LeaseStore(leases, lease_id(s.namespace, partition), s.instance_id, s.lease_ttl_s,
                       partition=partition, namespace=s.namespace, delivery=s.delivery)
    builder = MessageBuilder(s, folder or SchemaFolder.bundled(), native=native)
    stages = pipeline(partition, s.field_aggregate_id)
    scan_filter = None if partition is None or partition.count == 1 else partition_predicate(
        partition, f"${s.field_aggregate_id}")
    fingerprint = pipeline_fingerprint(s.namespace, stages)
    offsets = OffsetsTopic(s)
    exactly_once = s.delivery == "exactly-once"

    def preflight() -> None:
        check_config(s)
        if exactly_once:
            check_transactional_config(s, lease.lease_id)
        check_mongodb(client, s)
        prepare(leases, s.namespace, s.partitions)
        check_kafka(s)
        if exactly_once:
            offsets.ensure()

    def publisher() -> PublisherBoundary:
        if exactly_once:
            return TransactionalPublisher(s, lease.lease_id, offsets, fingerprint)
        return Publisher(s)

    def resume_transactional(p: PublisherBoundary, grant: Grant, heartbeat: Callable[[], None]) -> Checkpoint:
        assert isinstance(p, TransactionalPublisher)
        return p.resume_point(grant, heartbeat)

    def nothing() -> None:
        pass

    resume: ResumePoint = (resume_transactional if exactly_once
                           else offsets.after_exactly_once(lease.lease_id, fingerprint))
    return Relay(
        s,
        source=lambda: ChangeSource(outbox, s.max_await_ms, s.batch_max_events, s.field_occurred_at,
                                    pipeline=stages, scan_filter=scan_filter),
        publisher=publisher,
        lease=lease,
        encoder=builder,
        observer=observer or Observer(s),
        fingerprint=fingerprint,
        preflight=preflight if own_client else nothing,
        close=client.close if own_client else nothing,
        resume=resume,
        assignment=assignment,
    )


def build_group(settings: Settings, folder: SchemaFolder | None = None, native: bool = True) -> Group:
    """A group of RELAY_PARTITIONS relays sharing one MongoDB client (relay.group.Group), with
    its heartbeat, and start-up checks: librdkafka accepts the configuration, MongoDB answers
    and can compute partitions, the partition count did not change under running relays (or
    the outbox moves to it: relay.repartition), every partition's lease document exists, Kafka
    answers (and, in exactly-once mode, the offsets topic exists, compacted)."""
    s = settings
    client = mongo_client(s)
    db = client[s.database]
    leases = db[s.lease_collection]
    folder = folder or SchemaFolder.bundled()
    observer = GroupObserver(s)
    balance = Balance(s.partitions)
    relays = [(p, build_relay(s, observer.partition(p), folder, native=native, partition=p, client=client,
                              assignment=PartitionAssignment(balance, p.index)))
              for p in partitions(s.partitions)]
    exactly_once = s.delivery == "exactly-once"

    def preflight() -> None:
        check_config(s)
        for p in partitions(s.partitions) if exactly_once else []:
            check_transactional_config(s, lease_id(s.namespace, p))
        check_mongodb(client, s)
        check_server(db[s.outbox_collection], s.partitions)
        prepare(leases, s.namespace, s.partitions)
        for p in partitions(s.partitions):  # so a later change of count finds all of them
            LeaseStore(leases, lease_id(s.namespace, p), s.instance_id, s.lease_ttl_s, partition=p,
                       namespace=s.namespace, delivery=s.delivery).ensure()
        check_kafka(s)
        if exactly_once:
            OffsetsTopic(s).ensure()

    return Group(s, relays, balance, Membership(leases, s.namespace, s.instance_id, s.partitions, s.lease_ttl_s),
                 observer, preflight, client.close)

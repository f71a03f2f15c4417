"""Wiring: the relay with its real boundaries (pymongo, confluent-kafka, the lease document).

`build` is what `outbox-relay run`, the demo, the tests and the benchmarks call: one `Relay`
for the whole outbox (RELAY_PARTITIONS=1), or a `Group` running one per partition. Those are
the only places that build clients for the loop; the loop itself (`relay.relay.Relay`) never
builds one.
"""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient

from relay.boundaries import ALWAYS, Assignment
from relay.changes import ChangeSource, pipeline, pipeline_fingerprint
from relay.config import Settings
from relay.connections import check_kafka, check_mongodb, mongo_client
from relay.encoding import MessageBuilder, SchemaFolder
from relay.group import Balance, Group, PartitionAssignment
from relay.lease import LeaseStore
from relay.membership import Membership
from relay.observe import GroupObserver, Observer
from relay.partitioning import Partition, lease_id, partition_predicate, partitions
from relay.publisher import Publisher, check_config
from relay.relay import Relay
from relay.repartition import check_server, prepare


def build(settings: Settings, observer: Observer | None = None,
          folder: SchemaFolder | None = None) -> Relay | Group:
    """What runs the outbox: `build_relay` when RELAY_PARTITIONS is 1, else `build_group`.
    Either has `run()`, `stop()` and `observer` (with its metrics `registry`)."""
    if settings.partitions == 1:
        return build_relay(settings, observer, folder)
    return build_group(settings, folder)


def build_relay(settings: Settings, observer: Observer | None = None, folder: SchemaFolder | None = None,
                *, partition: Partition | None = None, client: MongoClient[Any] | None = None,
                assignment: Assignment = ALWAYS) -> Relay:
    """A relay for `settings`: its MongoDB client (closed when the relay stops), lease document,
    change source and producer factories, the message builder over `folder` (default: the bundled
    schemas/), and start-up checks (librdkafka accepts the configuration; MongoDB and Kafka
    answer; the partition count did not change under running relays) that run first in
    `Relay.run()`.

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
                       partition=partition, namespace=s.namespace)
    builder = MessageBuilder(s, folder or SchemaFolder.bundled())
    stages = pipeline(partition, s.field_aggregate_id)
    scan_filter = None if partition is None or partition.count == 1 else partition_predicate(
        partition, f"${s.field_aggregate_id}")

    def preflight() -> None:
        check_config(s)
        check_mongodb(client, s)
        prepare(leases, s.namespace, s.partitions)
        check_kafka(s)

    def nothing() -> None:
        pass

    return Relay(
        s,
        source=lambda: ChangeSource(outbox, s.max_await_ms, s.batch_max_events, s.field_occurred_at,
                                    pipeline=stages, scan_filter=scan_filter),
        publisher=lambda: Publisher(s),
        lease=lease,
        encoder=builder,
        observer=observer or Observer(s),
        fingerprint=pipeline_fingerprint(s.namespace, stages),
        preflight=preflight if own_client else nothing,
        close=client.close if own_client else nothing,
        assignment=assignment,
    )


def build_group(settings: Settings, folder: SchemaFolder | None = None) -> Group:
    """A group of RELAY_PARTITIONS relays sharing one MongoDB client (relay.group.Group), with
    its heartbeat, and start-up checks: librdkafka accepts the configuration, MongoDB answers
    and can compute partitions, the partition count did not change under running relays (or
    the outbox moves to it: relay.repartition), every partition's lease document exists, Kafka
    answers."""
    s = settings
    client = mongo_client(s)
    db = client[s.database]
    leases = db[s.lease_collection]
    folder = folder or SchemaFolder.bundled()
    observer = GroupObserver(s)
    balance = Balance(s.partitions)
    relays = [(p, build_relay(s, observer.partition(p), folder, partition=p, client=client,
                              assignment=PartitionAssignment(balance, p.index)))
              for p in partitions(s.partitions)]

    def preflight() -> None:
        check_config(s)
        check_mongodb(client, s)
        check_server(db[s.outbox_collection], s.partitions)
        prepare(leases, s.namespace, s.partitions)
        for p in partitions(s.partitions):  # so a later change of count finds all of them
            LeaseStore(leases, lease_id(s.namespace, p), s.instance_id, s.lease_ttl_s, p, s.namespace).ensure()
        check_kafka(s)

    return Group(s, relays, balance, Membership(leases, s.namespace, s.instance_id, s.partitions, s.lease_ttl_s),
                 observer, preflight, client.close)

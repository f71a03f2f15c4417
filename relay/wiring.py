"""Wiring: the relay with its real boundaries; the one place that reads the whole Settings.

`build` is what `outbox-relay run`, the demo, the tests and the benchmarks call: the process's
`Group` (relay.group.runner), running one `Relay` loop per scope (every outbox of the deployment,
in every partition), each with its own lease and producer; the change streams are the process's,
one per database holding outboxes (or one for the cluster), shared by the loops that lead
(relay.mongo.shared_reader). Each part gets its own configuration (`Settings.parts()`), never the
settings themselves. This is the only place that builds clients for the loops; the loop itself
(`relay.core.loop.Relay`) never builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from pymongo import MongoClient

from relay.avro.config import EncodingConfig
from relay.avro.encoding import MessageBuilder
from relay.avro.folder import SchemaFolder
from relay.avro.framing import Framing, framing_for
from relay.config import PartConfigs, Settings
from relay.core.boundaries import Assignment, Broker, SystemClock
from relay.core.change import Change
from relay.core.coalescer import Coalescer
from relay.core.config import DEAD_LETTER
from relay.core.errors import ForeignClassifier, first_of
from relay.core.loop import Relay
from relay.core.namespace import Namespace
from relay.core.partitions import Scope
from relay.group.balance import LeaseAssignment, balance_for
from relay.group.config import group_name
from relay.group.runner import Group
from relay.kafka import errors as kafka_errors
from relay.kafka.broker import Kafka
from relay.mongo import errors as mongo_errors
from relay.mongo.checkpoints import MongoCheckpointStore
from relay.mongo.config import CLUSTER
from relay.mongo.connection import check_mongodb, mongo_client
from relay.mongo.cursor import Cursor, oplog_start
from relay.mongo.housekeeping import Housekeeper, Watched, cleaner_for, shares_of
from relay.mongo.lease import LeaseStore
from relay.mongo.membership import Membership
from relay.mongo.outboxes import added
from relay.mongo.pipeline import StreamPlan, fingerprint, scan_filter
from relay.mongo.privileges import check as check_privileges
from relay.mongo.privileges import required_for
from relay.mongo.repartition import check_server, prepare
from relay.mongo.rescan import rescan_changes
from relay.mongo.shared_reader import SharedStream
from relay.mongo.subscription import Subscription, subscriptions
from relay.ops.health import Health
from relay.ops.observe import ProcessObserver, ScopeObserver
from relay.ops.outbox_checks import OutboxMetrics, OutboxSeries

# What the loop does with the drivers' exceptions (relay.core.errors.classify), with Kafka.
DRIVER_ERRORS = first_of(mongo_errors.action_for, kafka_errors.action_for)


def broker_for(parts: PartConfigs) -> Broker:
    """The process's broker, chosen here once (RELAY_BROKER): Kafka, NATS JetStream or RabbitMQ
    (relay.nats and relay.rabbitmq need the `nats` and `rabbitmq` extras: imported only when chosen)."""
    scopes = parts.scopes()
    dead_letter = parts.encoding.dead_letter_topic if parts.loop.on_poison == DEAD_LETTER else None
    if parts.broker == "nats":
        from relay.nats.broker import JetStream

        templates = [parts.encoding_for(n).event_topic_template for n in parts.outboxes]
        return JetStream(parts.nats, parts.loop, templates, dead_letter)
    if parts.broker == "rabbitmq":
        from relay.rabbitmq.broker import RabbitMQ

        return RabbitMQ(parts.rabbitmq, dead_letter)
    return Kafka(parts.kafka, [scope.lease_id for scope in scopes])


def driver_errors(broker: Broker) -> ForeignClassifier:
    """What the loop does with MongoDB's and `broker`'s exceptions (relay.core.errors.classify)."""
    return first_of(mongo_errors.action_for, broker.action_for)


def build(settings: Settings, folder: SchemaFolder | None = None, native: bool = True) -> Group:
    """The relay process for `settings`: a group of relay loops, one per scope, sharing one MongoDB
    client and the change streams, with the group's heartbeat (membership), housekeeping and
    start-up checks (`_preflight`), which `Group.run()` runs first. It has `run()`, `stop()` and
    `observer` (with its metrics `registry` and `serve()`)."""
    parts = settings.parts()
    mongo, group = parts.mongo, parts.group
    client = mongo_client(mongo)
    folder = folder or SchemaFolder.bundled()
    observer = ProcessObserver(parts.observer, parts.outboxes)
    scopes = parts.scopes()
    balance = balance_for(len(scopes), group.partitions)
    broker = broker_for(parts)
    streams = shared_streams(parts, client)
    leases = {scope: lease_store(parts, client, scope) for scope in scopes}
    checkpoints = process_checkpoints(parts, client, leases.values())
    relays = [
        (
            scope,
            _relay(parts, scope, client, streams[_stream_of(parts, scope)], observer.loop(scope), folder, native,
                   LeaseAssignment(balance, k), leases[scope], checkpoints, broker),
        )
        for k, scope in enumerate(scopes)
    ]  # fmt: skip
    housekeeper = housekeeping(parts, client, observer.metrics.registry, observer.health)

    def start() -> None:
        _preflight(parts, client, broker)
        housekeeper.start()

    def close() -> None:
        housekeeper.stop()
        for stream in streams.values():
            stream.close()
        client.close()
        broker.close()

    membership = Membership(mongo.leases(client), group_name(parts.outboxes), group.instance_id, group.partitions,
                            group.timing.lease_ttl_s)  # fmt: skip
    return Group(group, relays, balance, membership, observer, start, close)


def lease_store(parts: PartConfigs, client: MongoClient[Any], scope: Scope) -> LeaseStore:
    """The lease document of `scope` for this replica: the one way the running relay and the
    group's start-up build it."""
    return LeaseStore(
        parts.mongo.leases(client),
        scope,
        parts.group.instance_id,
        parts.group.timing.lease_ttl_s,
        delivery=parts.kafka.delivery,
    )


def message_builder(
    settings: Settings | PartConfigs,
    folder: SchemaFolder | None = None,
    framing: Framing | None = None,
    native: bool = True,
    encoding: EncodingConfig | None = None,
) -> MessageBuilder:
    """The message builder over `folder` (default: the bundled schemas/), with `framing` or the one
    the settings select, for the first outbox (or `encoding`'s); `native=False` builds every
    message in Python, for comparisons."""
    parts = settings.parts() if isinstance(settings, Settings) else settings
    folder = folder or SchemaFolder.bundled()
    encoding = encoding or parts.encoding
    return MessageBuilder(encoding, folder, framing or framing_for(parts.registry, folder), native=native)


def stream_plans(parts: PartConfigs) -> list[StreamPlan]:
    """The change streams of the deployment: one per database holding outboxes, or one for the
    cluster (RELAY_CHANGE_STREAMS)."""
    mongo, count = parts.mongo, parts.group.partitions
    if mongo.change_streams == CLUSTER:
        return [StreamPlan(parts.outboxes, count, None)]
    databases: dict[str, list[Namespace]] = {}
    for namespace in parts.outboxes:
        databases.setdefault(namespace.database, []).append(namespace)
    return [StreamPlan(tuple(outboxes), count, database) for database, outboxes in databases.items()]


def process_checkpoints(parts: PartConfigs, client: MongoClient[Any], leases: Iterable[LeaseStore]) -> Coalescer:
    """Where the process's loops store their checkpoints: together, in one MongoDB transaction over
    their lease documents, at most once per RELAY_CHECKPOINT_INTERVAL_MS or every
    RELAY_CHECKPOINT_MAX_EVENTS acknowledged events (relay.core.coalescer).
    The lease documents of every outbox live in one collection (the state database), so one
    write covers every database the process reads."""
    store = MongoCheckpointStore(client, {lease.lease_id: lease for lease in leases})
    loop = parts.loop
    return Coalescer(store, loop.checkpoint_interval_ms / 1000, SystemClock(), loop.checkpoint_max_events)


def shared_streams(parts: PartConfigs, client: MongoClient[Any]) -> dict[str | None, SharedStream]:
    """The process's change streams, by database (None: the cluster's)."""
    mongo, loop = parts.mongo, parts.loop
    field = parts.encoding.fields.aggregate_id
    read_events = max(1, loop.max_in_flight_events // loop.pipeline_depth)

    def stream(plan: StreamPlan) -> SharedStream:
        def cursor() -> Cursor:
            return Cursor(client, plan.database, plan.collection, plan.stages(field), mongo.max_await_ms)

        return SharedStream(
            plan,
            cursor,
            read_events,
            mongo.max_await_ms / 1000,
            lambda: oplog_start(client),
            mongo.read_linger_ms / 1000,
        )

    return {plan.database: stream(plan) for plan in stream_plans(parts)}


def _stream_of(parts: PartConfigs, scope: Scope) -> str | None:
    return None if parts.mongo.change_streams == CLUSTER else scope.database


def _relay(
    parts: PartConfigs,
    scope: Scope,
    client: MongoClient[Any],
    stream: SharedStream,
    observer: ScopeObserver,
    folder: SchemaFolder,
    native: bool,
    assignment: Assignment,
    lease: LeaseStore,
    checkpoints: Coalescer,
    broker: Broker,
) -> Relay[ScopeObserver]:
    """The relay loop of `scope` on the process's `client`, `stream`, `checkpoints` and `broker`: its
    `lease`, change source, delivery mode, message builder and assignment."""
    selection = fingerprint(scope, parts.encoding.fields.aggregate_id)
    return Relay(
        parts.loop,
        source=change_source(parts, client, stream, scope),
        mode=broker.mode(scope.lease_id, selection),
        lease=lease,
        encoder=message_builder(parts, folder, native=native, encoding=parts.encoding_for(scope.namespace)),
        observer=observer,
        fingerprint=selection,
        assignment=assignment,
        foreign_errors=driver_errors(broker),
        coalescer=checkpoints,
    )


def change_source(
    parts: PartConfigs, client: MongoClient[Any], stream: SharedStream, scope: Scope
) -> Callable[[], Subscription]:
    """The change source factory of `scope`: a subscription to `stream` per leading session, with
    its outbox's documents for a rescan."""
    fields = parts.encoding.fields
    outbox = parts.mongo.outbox(client, scope.namespace)
    documents = scan_filter(scope.partition, fields.aggregate_id)

    def scan() -> Iterator[Change]:
        return rescan_changes(outbox, fields.occurred_at, documents)

    return subscriptions(stream, scope, scan)


def _preflight(parts: PartConfigs, client: MongoClient[Any], broker: Broker) -> None:
    """The process's start-up checks: the broker's client accepts the configuration (librdkafka:
    each lease's transactional producer, in exactly-once mode); MongoDB answers, the user holds the
    privileges the outboxes and the mode need, and the server can compute partitions; the partition
    count did not change under running relays (or each outbox moves to it: relay.mongo.repartition);
    every scope's lease document exists (an added outbox's marked to rescan: relay.mongo.outboxes);
    the broker answers and holds what the relay needs (Kafka's offsets topic in exactly-once mode,
    NATS's stream, RabbitMQ's exchange: relay.kafka.broker, relay.nats.broker, relay.rabbitmq.broker)."""
    mongo, count = parts.mongo, parts.group.partitions
    scopes = parts.scopes()
    broker.check_settings()
    check_mongodb(client, mongo)
    check_privileges(client, required_for(mongo, parts.outboxes, parts.cleanup))
    check_server(mongo.outbox(client, parts.outboxes[0]), count)
    leases = mongo.leases(client)
    for namespace in parts.outboxes:
        prepare(leases, namespace, count)
    new = added(leases, parts.outboxes)
    for scope in scopes:  # so a later change of count finds all of them
        lease_store(parts, client, scope).ensure(rescan=scope.namespace in new)
    broker.check_servers()


def housekeeping(
    parts: PartConfigs, client: MongoClient[Any], registry: CollectorRegistry, health: Health
) -> Housekeeper:
    """The outbox checks and clean-up by checkpoint (relay.mongo.housekeeping) of one process, over
    every outbox and the lease ids it may lead, reporting to its metrics and health."""
    mongo, field = parts.mongo, parts.encoding.fields
    series = OutboxSeries(registry)
    watched = [
        Watched(
            cleaner_for(client, mongo, namespace, field.occurred_at, parts.cleanup),
            shares_of(namespace, parts.group.partitions, field.aggregate_id),
            OutboxMetrics(series, health, namespace),
        )
        for namespace in parts.outboxes
    ]
    return Housekeeper(watched, mongo.leases(client), parts.group.instance_id, parts.cleanup)

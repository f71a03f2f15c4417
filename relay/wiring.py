"""Wiring: the relay with its real boundaries (pymongo, confluent-kafka, the lease document).

`build_relay` is the one place that builds clients for the loop; `outbox-relay run`, the demo,
the tests and the benchmarks call it. The loop itself (`relay.relay.Relay`) never builds one.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.boundaries import Publisher as PublisherBoundary, ResumePoint
from relay.changes import ChangeSource, pipeline_fingerprint
from relay.config import Settings
from relay.connections import check_kafka, check_mongodb, mongo_client
from relay.encoding import MessageBuilder, SchemaFolder
from relay.lease import Checkpoint, Grant, LeaseStore
from relay.observe import Observer
from relay.publisher import Publisher, check_config
from relay.relay import Relay
from relay.transactions import OffsetsTopic, TransactionalPublisher, check_transactional_config


def build_relay(settings: Settings, observer: Observer | None = None,
                folder: SchemaFolder | None = None, native: bool = True) -> Relay:
    """A relay for `settings`: its MongoDB client (closed when the relay stops), lease document,
    change source and producer factories, the message builder over `folder` (default: the bundled
    schemas/; `native=False` builds every message in Python, for comparisons), and start-up checks
    (librdkafka accepts the configuration; MongoDB and Kafka answer; in exactly-once mode the
    offsets topic exists, compacted) that run first in `Relay.run()`.

    RELAY_DELIVERY picks the producer and the resume point: at-least-once, the idempotent
    producer and the lease document's checkpoint (or, right after an exactly-once run, the newer
    of it and the offsets topic's record); exactly-once, a transactional producer per leading
    session (relay.transactions), which fences earlier ones and resumes after the newer of the
    two."""
    s = settings
    client = mongo_client(s)
    db = client[s.database]
    outbox = db[s.outbox_collection]
    lease = LeaseStore(db[s.lease_collection], s.namespace, s.instance_id, s.lease_ttl_s, s.delivery)
    builder = MessageBuilder(s, folder or SchemaFolder.bundled(), native=native)
    fingerprint = pipeline_fingerprint(s.namespace)
    offsets = OffsetsTopic(s)
    exactly_once = s.delivery == "exactly-once"

    def preflight() -> None:
        check_config(s)
        if exactly_once:
            check_transactional_config(s, lease.lease_id)
        check_mongodb(client, s)
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

    resume: ResumePoint = (resume_transactional if exactly_once
                           else offsets.after_exactly_once(lease.lease_id, fingerprint))
    return Relay(
        s,
        source=lambda: ChangeSource(outbox, s.max_await_ms, s.batch_max_events, s.field_occurred_at),
        publisher=publisher,
        lease=lease,
        encoder=builder,
        observer=observer or Observer(s),
        fingerprint=fingerprint,
        preflight=preflight,
        close=client.close,
        resume=resume,
    )

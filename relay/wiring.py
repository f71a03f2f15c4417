"""Wiring: the relay with its real boundaries (pymongo, confluent-kafka, the lease document).

`build_relay` is the one place that builds clients for the loop; `outbox-relay run`, the demo,
the tests and the benchmarks call it. The loop itself (`relay.relay.Relay`) never builds one.
"""

from __future__ import annotations

from relay.changes import ChangeSource, pipeline_fingerprint
from relay.config import Settings
from relay.connections import check_kafka, check_mongodb, mongo_client
from relay.encoding import MessageBuilder, SchemaFolder
from relay.lease import LeaseStore
from relay.observe import Observer
from relay.publisher import Publisher, check_config
from relay.relay import Relay


def build_relay(settings: Settings, observer: Observer | None = None,
                folder: SchemaFolder | None = None, native: bool = True) -> Relay:
    """A relay for `settings`: its MongoDB client (closed when the relay stops), lease document,
    change source and producer factories, the message builder over `folder` (default: the
    bundled schemas/; `native=False` builds every message in Python, for comparisons), and
    start-up checks (librdkafka accepts the configuration; MongoDB and Kafka answer) that run
    first in `Relay.run()`."""
    s = settings
    client = mongo_client(s)
    db = client[s.database]
    outbox = db[s.outbox_collection]
    lease = LeaseStore(db[s.lease_collection], s.namespace, s.instance_id, s.lease_ttl_s)
    builder = MessageBuilder(s, folder or SchemaFolder.bundled(), native=native)

    def preflight() -> None:
        check_config(s)
        check_mongodb(client, s)
        check_kafka(s)

    return Relay(
        s,
        source=lambda: ChangeSource(outbox, s.max_await_ms, s.batch_max_events, s.field_occurred_at),
        publisher=lambda: Publisher(s),
        lease=lease,
        encoder=builder,
        observer=observer or Observer(s),
        fingerprint=pipeline_fingerprint(s.namespace),
        preflight=preflight,
        close=client.close,
    )

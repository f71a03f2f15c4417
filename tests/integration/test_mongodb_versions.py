"""The MongoDB versions the README names: the tests' servers run 6.0.27 (the last 6.0 patch); the
oldest version supported, 6.0.5, gets a smoke test: the relay end to end on a one-member replica
set of its own (relay.dev.mongodb), the session's Kafka broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from relay.dev import mongodb
from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.servers import needs_local_stack, replica_set
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import write_events


def _version(uri: str) -> str:
    client: pymongo.MongoClient[Any]
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as client:
        return str(client.server_info()["version"])


def test_the_servers_the_tests_start_run_mongodb_6_0_27(servers):
    needs_local_stack(servers)
    assert _version(servers.mongodb_uri) == mongodb.DEFAULT_VERSION == "6.0.27"


@pytest.fixture(scope="module")
def oldest(session_servers: Any) -> Iterator[Any]:
    """A one-member replica set of the oldest supported mongod, stopped by pid at the module's end."""
    with replica_set("outbox-relay-mongodb-6.0.5-", mongod=mongodb.installed(mongodb.OLDEST_VERSION)) as rs:
        yield rs


def test_the_relay_publishes_in_order_and_resumes_from_its_checkpoint_on_mongodb_6_0_5(env, oldest):
    assert _version(oldest.uri) == mongodb.OLDEST_VERSION == "6.0.5"
    settings = env.settings.replace(mongodb_uri=oldest.uri)
    bootstrap, topic = env.servers.kafka_bootstrap, env.topic()
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(oldest.uri, tz_aware=True)
    db = client[settings.database]
    db.create_collection(settings.outbox_collection)

    def published(count: int, relay: RelayThread) -> Any:
        return wait_until(lambda: (r := read_topic(bootstrap, topic, timeout=10)) and len({x.id for x in r}) >= count
                          and r, 60, f"{count} events in the topic", alive=relay.check_alive)

    def stored() -> str:
        return str(((lease_doc(db, settings) or {}).get("resumeToken") or {}).get("_data", ""))

    try:
        # From the oplog's start (written before the first start), then from the live stream.
        written = write_events(db, settings.outbox_collection, total=40, writers=2)
        with RelayThread(settings) as first:
            write_events(db, settings.outbox_collection, total=20, writers=2, seed=2, written=written)
            records = published(60, first)
            last = max(r.position for r in records)
            wait_until(lambda: stored() >= last, 30, "a checkpoint covering the last event", alive=first.check_alive)
        assert first.error is None, first.error
        # A restart resumes after the stored checkpoint: the new events, none of the old ones.
        with RelayThread(settings.replace(instance_id=f"{settings.instance_id}-2")) as second:
            write_events(db, settings.outbox_collection, total=20, writers=2, seed=3, written=written)
            records = published(80, second)
        assert second.error is None, second.error
    finally:
        client.drop_database(settings.database)
        client.close()
    verdict = assert_complete_and_ordered(records, written)
    assert len(written.ids) == 80
    assert verdict.duplicates == [], f"{len(verdict.duplicates)} events published twice"
    assert {r.fencing for r in records} == {1, 2}, "the restart took the lease over"

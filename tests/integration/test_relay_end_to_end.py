"""The relay against a real mongod replica set and a real Kafka broker; nothing mocked."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from bson import json_util

from relay.core.positions import token_cluster_time
from relay.outbox import Outbox, OutboxEvent
from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import write_events


def test_ten_thousand_events_from_four_writers_arrive_in_commit_order_and_decode_to_the_outbox(env):
    with RelayThread(env.settings.replace(pipeline_depth=4)) as relay:  # the pipelined path
        written = write_events(env.db, env.settings.outbox_collection, total=10_000, writers=4, max_per_txn=5)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 10_000, 120,
                   "10,000 events in the topic")
    assert relay.error is None, relay.error
    records = read_topic(env.servers.kafka_bootstrap, env.topic())
    verdict = assert_complete_and_ordered(records, written)
    assert not verdict.duplicates, "a run without faults publishes each event once"
    # Decoded values equal the outbox documents.
    docs = {str(d["_id"]): d for d in env.outbox.find()}
    assert len(docs) == 10_000
    for r in records:
        doc = docs[r.id]
        assert r.key == doc["aggregateId"] == r.event["aggregateId"]
        assert r.event["aggregateType"] == doc["aggregateType"]
        assert r.event["eventType"] == doc["eventType"]
        assert r.event["occurredAt"] == doc["occurredAt"]
        assert json_util.loads(r.event["payload"]) == doc["payload"]
        assert r.headers["ce_id"] == r.id and r.headers["ce_type"] == doc["eventType"]
        assert r.headers["ce_subject"] == doc["aggregateId"] and r.headers["ce_specversion"] == "1.0"
        assert r.headers["content-type"] == "application/avro"
        assert r.fencing == 1


def test_events_written_before_the_first_start_are_all_published(env):
    written = write_events(env.db, env.settings.outbox_collection, total=500, writers=2)
    assert lease_doc(env.db, env.settings) is None, "no checkpoint yet"
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 500, 60, "500 events")
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)


def test_idle_outbox_checkpoint_advances_while_other_collections_are_written(env):
    Outbox(env.outbox).add(OutboxEvent.new("order", "a1", "Created", {"n": 1}))
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the first event")
        first = wait_until(lambda: (lease_doc(env.db, env.settings) or {}).get("resumeToken"), 30, "a checkpoint")
        first_time = token_cluster_time(first)
        stop = threading.Event()

        def other_writes() -> None:
            while not stop.is_set():
                env.db.unrelated.insert_one({"at": time.time()})
                stop.wait(0.05)

        writer = threading.Thread(target=other_writes)
        writer.start()
        try:
            def advanced():
                token = lease_doc(env.db, env.settings)["resumeToken"]
                return token != first and token_cluster_time(token) > first_time
            wait_until(advanced, 30, "the idle outbox's stored token to advance")
        finally:
            stop.set()
            writer.join()
    assert topic_size(env.servers.kafka_bootstrap, env.topic()) == 1


def test_start_at_now_skips_earlier_events_and_stores_the_opening_token(env):
    Outbox(env.outbox).add(OutboxEvent.new("order", "old", "Created", {"n": 0}))
    with RelayThread(env.settings.replace(start_at="now")):
        wait_until(lambda: (lease_doc(env.db, env.settings) or {}).get("resumeToken"), 30,
                   "the opening token stored before any event")
        Outbox(env.outbox).add(OutboxEvent.new("order", "new", "Created", {"n": 1}))
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the new event")
    assert [r.key for r in read_topic(env.servers.kafka_bootstrap, env.topic())] == ["new"]


def test_changed_pipeline_fingerprint_is_refused_with_a_clear_error(env):
    from relay.core.errors import PipelineMismatchError

    with RelayThread(env.settings):
        wait_until(lambda: (lease_doc(env.db, env.settings) or {}).get("resumeToken"), 30, "a checkpoint")
    env.db[env.settings.lease_collection].update_one({"_id": str(env.namespace)},
                                                     {"$set": {"pipelineFingerprint": "0123456789abcdef"}})
    with RelayThread(env.settings) as relay:
        relay.thread.join(timeout=30)
    assert isinstance(relay.error, PipelineMismatchError)
    assert "different change stream pipeline" in str(relay.error)


@pytest.mark.parametrize("bad_field, value, message", [
    ("aggregateId", None, "field 'aggregateId' is missing"),
    ("payload", "not a document", "field 'payload' must be a document"),
    ("occurredAt", "yesterday", "field 'occurredAt' must be a date"),
])
def test_malformed_outbox_document_stops_the_relay_naming_the_event(env, bad_field, value, message):
    from relay.core.errors import PoisonEventError

    Outbox(env.outbox).add(OutboxEvent.new("order", "ok-1", "Created", {"n": 1}))
    bad = OutboxEvent.new("order", "bad", "Created", {"n": 2}).to_document()
    if value is None:
        del bad[bad_field]
    else:
        bad[bad_field] = value
    env.outbox.insert_one(bad)
    Outbox(env.outbox).add(OutboxEvent.new("order", "ok-2", "Created", {"n": 3}))
    with RelayThread(env.settings) as relay:
        relay.thread.join(timeout=60)
    assert isinstance(relay.error, PoisonEventError)
    assert relay.error.event_id == str(bad["_id"]) and message in str(relay.error)
    # Nothing after the poison event was published, and the checkpoint did not pass it.
    keys = [r.key for r in read_topic(env.servers.kafka_bootstrap, env.topic())]
    assert "ok-2" not in keys


def test_oversized_event_stops_the_relay_naming_it(env):
    from relay.core.errors import PoisonEventError

    big = OutboxEvent.new("order", "big", "Created", {"blob": "x" * 2_000_000})
    Outbox(env.outbox).add(big)
    with RelayThread(env.settings) as relay:
        relay.thread.join(timeout=60)
    assert isinstance(relay.error, PoisonEventError) and relay.error.event_id == big.id_str
    assert "message.max.bytes" in str(relay.error)


def test_occurred_at_before_1970_and_nested_payload_round_trip(env):
    when = dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=dt.UTC)
    payload = {"nested": {"list": [1, 2.5, "three", None], "flag": True}, "big": 2**62}
    Outbox(env.outbox).add(OutboxEvent.new("order", "moon", "Landed", payload, occurred_at=when))
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the event")
    (record,) = read_topic(env.servers.kafka_bootstrap, env.topic())
    assert record.event["occurredAt"] == when
    assert record.headers["ce_time"] == "1969-07-20T20:17:40.000Z"
    assert json_util.loads(record.event["payload"]) == payload

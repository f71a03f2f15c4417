"""Faults in the data and the collection (docs/faults.md rows 6, 7, 8, 9)."""

from __future__ import annotations

import base64
import json
import os
import time

import pymongo
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from relay.core.errors import HistoryLostError, PoisonEventError, StreamInvalidatedError
from relay.core.positions import token_cluster_time
from relay.mongo.cursor import oplog_start
from relay.mongo.lease import cluster_time
from relay.outbox import Outbox, OutboxEvent
from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayProcess, RelayThread
from tests.support.servers import replica_set
from tests.support.topics import read_messages, read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events


def _incompressible(n: int) -> str:
    return base64.b64encode(os.urandom(n * 3 // 4)).decode()


def _limit_topic(env, max_bytes: int) -> None:
    with AdminClient({"bootstrap.servers": env.servers.kafka_bootstrap}) as admin:
        futures = admin.create_topics([NewTopic(env.topic(), 3, 1, config={"max.message.bytes": str(max_bytes)})])
        futures[env.topic()].result(timeout=30)


# ---- rows 8 and 9: poison events -------------------------------------------------------------

def test_event_larger_than_the_topic_accepts_stops_the_relay_naming_it(env):
    _limit_topic(env, 20_000)
    outbox = Outbox(env.outbox)
    outbox.add(OutboxEvent.new("order", "small-1", "Created", {"n": 1}))
    big = OutboxEvent.new("order", "big", "Created", {"blob": _incompressible(50_000)})
    outbox.add(big)
    with RelayThread(env.settings) as relay:
        relay.thread.join(timeout=90)
    assert isinstance(relay.error, PoisonEventError), relay.error
    assert relay.error.event_id == big.id_str and "larger than the broker accepts" in str(relay.error)
    assert relay.error.exit_code == 4
    assert "big" not in {r.key for r in read_topic(env.servers.kafka_bootstrap, env.topic())}


def test_poison_events_go_to_the_dead_letter_topic_with_the_reason_and_the_rest_flows_in_order(env):
    _limit_topic(env, 20_000)
    settings = env.settings.replace(on_poison="dead-letter", dead_letter_topic=f"{env.topic()}.dlq")
    written = Written()
    outbox = Outbox(env.outbox)
    good = [OutboxEvent.new("order", f"k{i % 3}", "Changed", {"seq": i}) for i in range(9)]
    too_big = OutboxEvent.new("order", "k1", "Changed", {"blob": _incompressible(50_000)})
    malformed = OutboxEvent.new("order", "k2", "Changed", {"seq": -1}).to_document()
    del malformed["eventType"]
    outbox.add_many(good[:3])
    outbox.add(too_big)
    outbox.add_many(good[3:6])
    env.outbox.insert_one(malformed)
    outbox.add_many(good[6:])
    written.add(good)
    with RelayThread(settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, settings.dead_letter_topic) >= 2, 90,
                   "two dead letters")
        wait_until(lambda: len({r.id for r in read_topic(env.servers.kafka_bootstrap, env.topic())}) >= 9, 60,
                   "the nine good events")
    assert relay.error is None, relay.error
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)
    dead = [{k: v.decode() for k, v in msg.headers() or []}
            for msg in read_messages(env.servers.kafka_bootstrap, settings.dead_letter_topic)]
    reasons = {h["ce_id"]: h["relay_dead_letter_reason"] for h in dead}
    assert "larger than the broker accepts" in reasons[too_big.id_str]
    assert "field 'eventType' is missing" in reasons[str(malformed["_id"])]
    assert relay.metric("relay_dead_letters_total") >= 2


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_poison_event_stops_the_relay_at_the_event_after_publishing_the_ones_before_it(env, tmp_path):
    """5 good, 1 bad, 5 good in one transaction: the 5 are published and checkpointed, then the relay
    exits 4 naming the event in one JSON ERROR line; a restart stops at the same event again."""
    good = [OutboxEvent.new("order", f"p{i % 2}", "Changed", {"seq": i}) for i in range(10)]
    bad = OutboxEvent.new("order", "p9", "Changed", {"seq": -1}).to_document()
    bad["aggregateId"] = None
    with env.client.start_session() as session, session.start_transaction():
        env.outbox.insert_many([e.to_document() for e in good[:5]] + [bad] + [e.to_document() for e in good[5:]],
                               session=session)
    stops = []
    for run in range(2):
        relay = RelayProcess(env.settings.replace(instance_id=f"run{run}"), tmp_path, f"run{run}",
                             extra_env={"RELAY_LOG_FORMAT": "json"}).start()
        assert relay.proc.wait(timeout=120) == 4, relay.log()
        lines = _json_lines(relay.log())
        [stop] = [line for line in lines if line["level"] == "ERROR"]
        assert stop["error_kind"] == "PoisonEventError" and stop["event_id"] == str(bad["_id"])
        assert stop["exit_code"] == 4 and "field 'aggregateId' is null" in stop["reason"]
        assert lines.index(stop) < next(i for i, line in enumerate(lines) if "lease released" in line["message"])
        assert "outbox-relay: PoisonEventError" not in relay.log(), "no second, plain-text copy"
        stops.append(stop["reason"])
        records = read_topic(env.servers.kafka_bootstrap, env.topic())
        assert sorted({r.id for r in records}) == sorted(e.id_str for e in good[:5])
        token = lease_doc(env.db, env.settings)["resumeToken"]
        with env.outbox.watch(resume_after=token) as stream:
            assert stream.next()["fullDocument"]["_id"] == bad["_id"], "the checkpoint is just before it"
    assert stops[0] == stops[1], "a restart stops at the same event with the same message"


# ---- row 7: the outbox collection dropped or renamed -----------------------------------------

@pytest.mark.parametrize("action", ["drop", "rename"])
def test_dropped_or_renamed_outbox_stops_the_relay_with_a_clear_error(env, action):
    written = write_events(env.db, env.settings.outbox_collection, total=100, writers=1)
    with RelayThread(env.settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 100, 60, "100 events")
        if action == "drop":
            env.outbox.drop()
        else:
            env.outbox.rename("outbox_renamed")
        relay.thread.join(timeout=60)
    assert isinstance(relay.error, StreamInvalidatedError), relay.error
    assert f"saw '{action}'" in str(relay.error) and relay.error.exit_code == 4
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)


# ---- row 6: history lost ------------------------------------------------------------------------

@pytest.fixture
def small_oplog(servers):
    """A single-member replica set with a 1 MB oplog, so history loss is real and quick."""
    with replica_set("outbox-relay-oplog-", members=1, oplog_size_mb=1, sync_delay_s=1) as rs:
        yield rs


def _lose_history(client: pymongo.MongoClient, db_name: str, token: dict) -> None:
    """Write unrelated data until the oplog no longer holds the stored token's time."""
    filler = client[db_name].filler
    stored = token_cluster_time(token)
    for _ in range(120):
        filler.insert_many([{"pad": "x" * 10_000} for _ in range(100)])
        if cluster_time(oplog_start(client)) > stored:
            return
        time.sleep(0.5)  # truncation waits for the next storage checkpoint (--syncdelay 1)
    raise AssertionError("the oplog did not roll over")


@pytest.mark.parametrize("policy", ["stop", "rescan"])
def test_history_lost_stops_with_a_clear_error_or_rescans_the_outbox(env, small_oplog, policy):
    settings = env.settings.replace(mongodb_uri=small_oplog.uri, on_history_lost=policy)
    client = pymongo.MongoClient(small_oplog.uri, tz_aware=True)
    db = client[settings.database]
    written = write_events(db, settings.outbox_collection, total=200, writers=2)
    with RelayThread(settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 200, 60, "200 events")
    token = lease_doc(db, settings)["resumeToken"]
    # While the relay is stopped: more outbox events, then enough other writes to roll the oplog.
    write_events(db, settings.outbox_collection, total=100, writers=1, seed=2, written=written)
    _lose_history(client, settings.database, token)
    with RelayThread(settings) as relay:
        if policy == "stop":
            relay.thread.join(timeout=60)
        else:
            wait_until(lambda: len({r.id for r in read_topic(env.servers.kafka_bootstrap, env.topic())}) >= 300,
                       90, "the rescan to publish the outbox")
            write_events(db, settings.outbox_collection, total=50, writers=1, seed=3, written=written)
            wait_until(lambda: len({r.id for r in read_topic(env.servers.kafka_bootstrap, env.topic())}) >= 350,
                       60, "events after the rescan, from the change stream")
    client.close()
    records = read_topic(env.servers.kafka_bootstrap, env.topic())
    if policy == "stop":
        assert isinstance(relay.error, HistoryLostError), relay.error
        assert "no longer in the oplog" in str(relay.error) and relay.error.exit_code == 4
        assert len({r.id for r in records}) == 200, "nothing published past the lost history"
    else:
        assert relay.error is None, relay.error
        verdict = assert_complete_and_ordered(records, written)
        # The 200 events published before the loss come again from the rescan (documented).
        assert len(verdict.duplicates) >= 200
        rescanned = [r for r in records if r.position.startswith("00")]
        assert len(rescanned) == 300 and all(r.event["source"]["clusterTime"] == 0 for r in rescanned)

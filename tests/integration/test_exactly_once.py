"""Exactly-once mode against the real servers: transactions, the offsets topic, mode switches,
poison events inside transactions, and `tail --isolation` (docs/exactly-once.md).

The kill, zombie and broker tests of this mode are in tests/faults/test_exactly_once_faults.py.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import subprocess
import sys
import threading

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from relay.commands.tail import tail
from relay.core.errors import PoisonEventError
from relay.core.message import OutgoingMessage
from relay.core.positions import Checkpoint, Grant
from relay.core.window import Parcel
from relay.kafka.committer import Committer
from relay.kafka.offsets_record import transactional_id
from relay.kafka.offsets_topic import OffsetsTopic
from relay.kafka.transactions import TransactionalPublisher
from relay.outbox import Outbox, OutboxEvent
from tests.faults.test_outbox_faults import _incompressible, _limit_topic
from tests.support.leases import CheckpointWatcher, lease_doc
from tests.support.oracle import all_published, assert_complete_and_ordered
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import read_messages, read_topic
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes, write_events


def eos(env, **changes):
    """The test's settings in exactly-once mode, with an offsets topic of its own."""
    prefix = env.settings.topic_template.split(".")[0]
    return env.settings.replace(delivery="exactly-once", offsets_topic=f"{prefix}.offsets", **changes)


def _no_record_twice(records, written) -> None:
    verdict = assert_complete_and_ordered(records, written)
    assert not verdict.duplicates, f"{len(verdict.duplicates)} events visible twice to read_committed"


def test_every_event_is_published_once_and_its_token_committed_to_the_compacted_offsets_topic(env):
    settings = eos(env)
    written = Written()
    with RelayThread(settings) as relay:
        writer = background_writes(env, written, 2000, writers=2, pause=0.005)
        writer.join()
        records = all_published(env, written)
    assert relay.error is None, relay.error
    _no_record_twice(records, written)
    uncommitted = read_topic(env.servers.kafka_bootstrap, env.topic(), isolation="read_uncommitted")
    assert len(uncommitted) == len(records), "no transaction was aborted: read_uncommitted sees the same"

    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.offsets_topic)
    with AdminClient({"bootstrap.servers": env.servers.kafka_bootstrap}) as admin:
        config = admin.describe_configs([resource])[resource].result(timeout=30)
        cluster = admin.list_topics(timeout=10)
    replicas = min(3, len(cluster.brokers))  # the test broker: one node, so 1 and min.insync.replicas 1
    assert config["cleanup.policy"].value == "compact"
    assert config["min.insync.replicas"].value == str(max(1, replicas - 1))
    meta = cluster.topics[settings.offsets_topic]
    assert len(meta.partitions) == 1 and len(meta.partitions[0].replicas) == replicas

    record = OffsetsTopic(settings.parts().kafka).read(str(settings.namespaces[0]), lambda: None)
    doc = lease_doc(env.db, settings)
    assert record is not None and record.fingerprint == doc["pipelineFingerprint"]
    assert record.token["_data"] >= max(r.position for r in records), "the record covers every event"
    assert doc["resumeToken"]["_data"] >= record.token["_data"], "the MongoDB checkpoint is stored after it"
    assert doc["delivery"] == "exactly-once" and record.owner == settings.instance_id


def test_a_parcel_is_acknowledged_only_once_the_loop_saw_its_transactions_commit_end(env, monkeypatch):
    """The publisher's invariant, in process on the real broker: the commit thread is held after
    its flush (every report of the transaction served, EndTxn not sent), as tests/faults/slow_commit.py
    holds it. Meanwhile the loop polls on and hands the next parcel over (it waits, not produced):
    neither is acknowledged, and read_committed sees nothing. Once the commit ends, the loop's next
    poll releases the first parcel, acknowledged, and the second begins the next transaction."""
    held, release = threading.Event(), threading.Event()
    commit = Committer._run

    def held_after_flush(self: Committer) -> None:
        self._producer.flush(30)
        held.set()
        assert release.wait(60), "never released"
        commit(self)

    monkeypatch.setattr(Committer, "_run", held_after_flush)
    topic, bootstrap = env.topic(), env.servers.kafka_bootstrap
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    kafka = eos(env, transaction_max_events=1).parts().kafka  # each parcel a transaction of its own
    offsets = OffsetsTopic(kafka)
    offsets.ensure()
    publisher = TransactionalPublisher(kafka, f"{env.namespace}.invariant", offsets, "fingerprint")
    first, second = (
        Parcel([-1], [OutgoingMessage(f"e{n}", topic, b"k", f"v{n}".encode(), [])], {"_data": f"0{n}"}, 0.0)
        for n in (1, 2)
    )
    try:
        publisher.fence(Grant("me", 1, dt.datetime.now(dt.UTC), Checkpoint(None, None, None)), lambda: None)
        publisher.send(first, lambda: None)  # the bound of one event: its commit starts
        assert held.wait(60), "the commit never started"
        publisher.send(second, lambda: None)  # waits for that commit
        for _ in range(5):
            publisher.poll(0.05)
        assert not first.done and not second.done, "nothing is acknowledged before its commit ended"
        assert first.pending == 1 and first.failure is None, "every report in, the transaction's end held back"
        assert read_messages(bootstrap, topic, timeout=10) == [], "read_committed sees nothing yet"
        release.set()
        wait_until(lambda: publisher.poll(0.05) or first.done, 60, "the loop to see the commit end")
        assert first.acknowledged
        publisher.drain(30)
        assert second.acknowledged
    finally:
        release.set()
        publisher.close()
    assert [m.value() for m in read_messages(bootstrap, topic, timeout=10)] == [b"v1", b"v2"]


def test_an_offsets_topic_that_is_not_compacted_is_refused_naming_the_setting(env):
    settings = eos(env)
    with AdminClient({"bootstrap.servers": env.servers.kafka_bootstrap}) as admin:
        admin.create_topics([NewTopic(settings.offsets_topic, 1, 1, config={"cleanup.policy": "delete"})])[
            settings.offsets_topic].result(timeout=30)
    run = subprocess.run([sys.executable, "-m", "relay", "run"], env=settings_env(settings), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    [stop] = [json.loads(line) for line in run.stderr.splitlines() if '"ERROR"' in line]
    assert stop["error_kind"] == "ConfigError" and "RELAY_OFFSETS_TOPIC" in stop["reason"]
    assert "cleanup.policy=delete" in stop["reason"]


def test_switching_at_least_once_to_exactly_once_starts_from_the_mongodb_checkpoint(env):
    written = Written()
    write_events(env.db, env.settings.outbox_collection, 600, writers=2, written=written)
    with RelayThread(env.settings.replace(instance_id="alo")):
        wait_until(lambda: len(read_topic(env.servers.kafka_bootstrap, env.topic())) >= 600, 60, "the first 600")
    checkpoint = lease_doc(env.db, env.settings)["resumeToken"]["_data"]
    write_events(env.db, env.settings.outbox_collection, 600, writers=2, written=written, seed=2)
    with RelayThread(eos(env, instance_id="eos")) as relay:
        records = all_published(env, written)
    assert relay.error is None, relay.error
    _no_record_twice(records, written)
    by_eos = [r for r in records if r.fencing == 2]
    assert len(by_eos) == 600 and min(r.position for r in by_eos) > checkpoint, \
        "the exactly-once leader published exactly the events after the at-least-once checkpoint"


def _rewind_checkpoint(env, settings, token_data: str) -> None:
    """Move the MongoDB checkpoint back, as a leader killed between its Kafka commits and its
    MongoDB writes would leave it (the offsets topic is ahead)."""
    env.db[settings.lease_collection].update_one({"_id": str(settings.namespaces[0])},
                                                 {"$set": {"resumeToken": {"_data": token_data}}})


def test_mongodb_checkpoint_lagging_the_offsets_topic_is_passed_by_either_mode_without_a_duplicate(env):
    """An exactly-once run, then its MongoDB checkpoint moved back some transactions (what a kill
    between a Kafka commit and the MongoDB write leaves, one transaction back, made larger here).
    A new exactly-once leader resumes after the offsets topic's record; so does an at-least-once
    leader, because the lease document says the checkpoint was stored in exactly-once mode."""
    settings = eos(env, batch_max_events=50)
    written = Written()
    with CheckpointWatcher(env.db, settings, interval=0.01) as watcher, RelayThread(settings):
        writer = background_writes(env, written, 1500, writers=2, pause=0.005)
        writer.join()
        all_published(env, written)
    for mode, more in (("exactly-once", 300), ("at-least-once", 300)):
        assert len(watcher.seen) > 3
        _rewind_checkpoint(env, settings, watcher.seen[len(watcher.seen) // 2])
        write_events(env.db, env.settings.outbox_collection, more, writers=2, written=written, seed=len(written.ids))
        with RelayThread(settings.replace(delivery=mode, instance_id=mode)) as relay:
            records = all_published(env, written)
        assert relay.error is None, relay.error
        _no_record_twice(records, written)
        assert lease_doc(env.db, settings)["delivery"] == mode


def test_a_poison_event_in_exactly_once_mode_stops_after_the_events_before_it_committed(env):
    """The broker refuses the big event's record batch: the transaction is aborted, the batch is
    replayed one message per transaction, the events before it commit, and the relay stops naming
    it. read_committed consumers see those events once; the aborted copies only read_uncommitted."""
    _limit_topic(env, 20_000)
    outbox = Outbox(env.outbox)
    before = [OutboxEvent.new("order", f"k{i % 3}", "Changed", {"seq": i}) for i in range(5)]
    big = OutboxEvent.new("order", "big", "Changed", {"blob": _incompressible(50_000)})
    outbox.add_many(before)
    outbox.add(big)
    outbox.add_many([OutboxEvent.new("order", "after", "Changed", {"seq": i}) for i in range(5)])
    with RelayThread(eos(env)) as relay:
        relay.thread.join(timeout=120)
    assert isinstance(relay.error, PoisonEventError), relay.error
    assert relay.error.event_id == big.id_str and relay.error.exit_code == 4
    visible = read_topic(env.servers.kafka_bootstrap, env.topic())
    assert sorted(r.id for r in visible) == sorted(e.id_str for e in before)
    uncommitted = read_topic(env.servers.kafka_bootstrap, env.topic(), isolation="read_uncommitted")
    assert len(uncommitted) > len(visible), "the refused transaction's messages were appended, then aborted"
    print(f"\npoison in a transaction: {len(visible)} visible, {len(uncommitted) - len(visible)} aborted copies")


def test_dead_letters_are_published_inside_the_transaction_of_their_batch(env):
    _limit_topic(env, 20_000)
    settings = eos(env, on_poison="dead-letter", dead_letter_topic=f"{env.topic()}.dlq")
    outbox = Outbox(env.outbox)
    good = [OutboxEvent.new("order", f"k{i % 3}", "Changed", {"seq": i}) for i in range(6)]
    big = OutboxEvent.new("order", "k1", "Changed", {"blob": _incompressible(50_000)})
    outbox.add_many(good[:3])
    outbox.add(big)
    outbox.add_many(good[3:])
    written = Written()
    written.add(good)
    with RelayThread(settings) as relay:
        records = all_published(env, written)
        dead = wait_until(lambda: read_messages(env.servers.kafka_bootstrap, settings.dead_letter_topic), 60,
                          "the dead letter")
    assert relay.error is None, relay.error
    _no_record_twice(records, written)
    assert [dict(m.headers())["ce_id"].decode() for m in dead] == [big.id_str], "one dead letter, committed once"


def test_tail_shows_committed_transactions_only_unless_asked_for_read_uncommitted(env):
    topic = env.topic()
    with Producer({"bootstrap.servers": env.servers.kafka_bootstrap,
                   "transactional.id": transactional_id(f"tail-test.{topic}")}) as producer:
        producer.init_transactions(30)
        for commit, n in ((True, 3), (False, 2), (True, 1)):
            producer.begin_transaction()
            for i in range(n):
                producer.produce(topic, b"not avro", f"{commit}-{i}".encode(), partition=0)
            producer.flush(30)
            (producer.commit_transaction if commit else producer.abort_transaction)(30)
    counts = {}
    for isolation in ("read_committed", "read_uncommitted"):
        out = io.StringIO()
        assert tail(env.settings, topic, from_beginning=True, out=out, isolation=isolation) == 0
        counts[isolation] = [json.loads(line)["key"] for line in out.getvalue().splitlines()]
    # Without --follow tail ends at each partition's end although the last offsets are markers.
    assert counts["read_committed"] == ["True-0", "True-1", "True-2", "True-0"]
    assert counts["read_uncommitted"] == ["True-0", "True-1", "True-2", "False-0", "False-1", "True-0"]

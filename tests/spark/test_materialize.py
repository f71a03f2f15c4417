"""`materialize` on relay-produced topics: the views equal the state computed from the outbox,
with duplicates in the topics, when run again, when replayed from scratch, and when the job is
SIGKILLed mid-batch and restarted on its checkpoint."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from relay.commands.status import reset_checkpoint
from relay.outbox import Outbox, OutboxEvent
from relay.spark import PipelineError
from relay.spark.materialize import EVENTS_QUERY, STATE_QUERY, materialize
from relay.spark.state import conditional_upsert
from tests.spark.support import (
    SPARK_FLAGS,
    VIEW_COLLECTION,
    PipelineProcess,
    assert_view_equals_outbox,
    copies_of,
    materialize_config,
    mongo_view,
    outbox_state,
    parquet_view,
    positions,
)
from tests.support.relays import RelayThread
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events


def _read_all(env, types=("order", "customer")):
    return [r for t in types for r in read_topic(env.servers.kafka_bootstrap, env.topic(t))]


def _event_table_ids(spark, output: Path) -> list[str]:
    return [r["id"] for r in spark.read.parquet(str(output / "events")).select("id").collect()]


def test_views_equal_the_outbox_state_after_the_relay_replayed_duplicates(env, spark, tmp_path):
    bootstrap = env.servers.kafka_bootstrap
    # OrderCreated events: written with the typed envelope when schemas/events/ has one for it.
    typed = [OutboxEvent.new("order", f"typed-{i % 20}", "OrderCreated",
                             {"orderId": f"typed-{i % 20}", "amount": 12.5 + i, "step": i // 20 + 1})
             for i in range(60)]
    with RelayThread(env.settings):
        written = [("order", write_events(env.db, env.settings.outbox_collection, total=1500, writers=3)),
                   ("customer", write_events(env.db, env.settings.outbox_collection, total=500, writers=2,
                                             aggregate_type="customer", seed=2)),
                   ("order", Written())]
        Outbox(env.outbox).add_many(typed)  # one insert each, in list order
        written[2][1].add(typed)
        wait_until(lambda: topic_size(bootstrap, env.topic("order")) >= 1560
                   and topic_size(bootstrap, env.topic("customer")) >= 500, 90, "2,060 events published")
    # The relay replays everything: checkpoint reset, restart from the oldest oplog entry.
    reset_checkpoint(env.settings)
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(bootstrap, env.topic("order")) >= 3120
                   and topic_size(bootstrap, env.topic("customer")) >= 1000, 90, "the replayed copies")
    records = _read_all(env)
    copies_of(records[::25], bootstrap)  # and a third copy of some
    all_ids = {i for _, w in written for i in w.ids}
    assert len(_read_all(env)) > 2 * len(all_ids), "the topics hold duplicates"
    expected = outbox_state(env.outbox, written)
    position_of = positions(records)

    output = tmp_path / "out"
    cfg = materialize_config(env.settings, output)
    materialize(spark, cfg)

    ids = _event_table_ids(spark, output)
    assert len(ids) == len(set(ids)) == len(all_ids) and set(ids) == all_ids, "each event exactly once"
    partitions = {p.name for p in (output / "events").iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert partitions == {"aggregateType=order", "aggregateType=customer"}
    assert_view_equals_outbox(parquet_view(spark, cfg.state_path), expected, position_of)
    assert_view_equals_outbox(mongo_view(env.db), expected, position_of)

    # Run again on the same checkpoint: nothing new, nothing changes.
    before = list(env.db[VIEW_COLLECTION].find(sort=[("_id", 1)]))
    materialize(spark, cfg)
    assert sorted(_event_table_ids(spark, output)) == sorted(ids)
    assert list(env.db[VIEW_COLLECTION].find(sort=[("_id", 1)])) == before

    # Replay the topics from scratch into the same read model: every intermediate state is
    # older than the stored one, so MongoDB keeps the final state; the new Parquet view agrees.
    replay = materialize_config(env.settings, tmp_path / "replay")
    materialize(spark, replay)
    assert list(env.db[VIEW_COLLECTION].find(sort=[("_id", 1)])) == before
    assert_view_equals_outbox(parquet_view(spark, replay.state_path), expected, position_of)


def test_a_stale_or_equal_version_never_overwrites_a_newer_state(env):
    coll = env.db["versioned"]
    key = {"aggregateType": "order", "aggregateId": "o-1"}

    def state(position: str, count: int, event: str) -> dict:
        return {"_id": key, **key, "lastEventId": event, "lastEventType": "T", "lastPayload": {},
                "lastOccurredAt": None, "lastPosition": position, "lastClusterTime": 0, "eventCount": count}

    assert conditional_upsert(coll, [state("8202", 2, "e2")]).applied == 1
    result = conditional_upsert(coll, [state("8201", 1, "e1"), state("8202", 2, "e2-again")])
    assert (result.applied, result.stale) == (0, 2)
    assert coll.find_one()["lastEventId"] == "e2"
    # A late, older event raises the count only: same position, greater count wins.
    assert conditional_upsert(coll, [state("8202", 3, "e2")]).applied == 1
    assert conditional_upsert(coll, [state("8203", 4, "e4")]).applied == 1
    assert (coll.find_one()["lastEventId"], coll.find_one()["eventCount"]) == ("e4", 4)


def test_outputs_without_their_checkpoint_are_refused(env, spark, tmp_path):
    output = tmp_path / "out"
    (output / "events" / "_spark_metadata").mkdir(parents=True)
    (output / "events" / "_spark_metadata" / "0").write_text("v1\n")
    with pytest.raises(PipelineError, match="holds an event table but .* has no checkpoint"):
        materialize(spark, materialize_config(env.settings, output))


def _batch_in_flight(checkpoint: Path, query: str) -> bool:
    """The query has planned a micro-batch (offsets/N) it has not committed (commits/N)."""
    def newest(folder: str) -> int:
        names = [p.name for p in (checkpoint / query / folder).glob("[0-9]*")]
        return max((int(n) for n in names if n.isdigit()), default=-1)
    return newest("offsets") > newest("commits") >= 0


@pytest.mark.timeout(1200)  # its waits add up to more than the suite's 600 s on a slow machine
def test_killed_mid_batch_and_restarted_the_job_neither_loses_nor_doubles(env, spark, tmp_path):
    """`outbox-relay pipeline materialize` (processing-time trigger) is SIGKILLed while a micro-batch
    is in flight, events keep coming, and the job restarts on the same checkpoint (here in this
    process, on the test session's Spark)."""
    bootstrap = env.servers.kafka_bootstrap
    output = tmp_path / "out"
    checkpoint = output / "_checkpoints"
    argv = ["materialize", "--output", str(output), "--interval", "0.5", "--max-offsets-per-trigger", "400",
            "--view-collection", VIEW_COLLECTION, *SPARK_FLAGS]
    written = write_events(env.db, env.settings.outbox_collection, total=1000, writers=2)
    stop_writing = threading.Event()

    def keep_writing() -> None:  # about 50 events a second while the job runs
        seed = 1
        while not stop_writing.is_set():
            seed += 1
            write_events(env.db, env.settings.outbox_collection, total=20, writers=2, seed=seed, written=written)
            stop_writing.wait(0.4)

    writer = threading.Thread(target=keep_writing)
    killed = PipelineProcess(argv, env.settings, tmp_path / "killed.log")
    stop_job = threading.Event()
    cfg = replace(materialize_config(env.settings, output, once=False), interval_s=0.5, max_offsets_per_trigger=400)
    failures: list[BaseException] = []

    def restart() -> None:
        try:
            materialize(spark, cfg, stop_job)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    restarted = threading.Thread(target=restart)
    with RelayThread(env.settings):
        writer.start()
        try:
            killed.start()
            killed.wait_until(lambda: (checkpoint / STATE_QUERY / "commits" / "0").exists(), 300,
                              "the first committed state batch")
            wait_until(lambda: _batch_in_flight(checkpoint, EVENTS_QUERY) or _batch_in_flight(checkpoint, STATE_QUERY),
                       60, "a micro-batch in flight", interval=0.01)
            killed.kill()
            killed_at = len(written.ids)
            restarted.start()
            wait_until(lambda: len(written.ids) > killed_at + 200, 60, "more events after the restart")
        finally:
            stop_writing.set()
            writer.join()
            killed.cleanup()
        try:
            total = len(written.ids)
            wait_until(lambda: topic_size(bootstrap, env.topic()) >= total, 90, "every event published")
            expected = outbox_state(env.outbox, [("order", written)])
            wait_until(lambda: not restarted.is_alive() or {
                k: {f: v for f, v in row.items() if f != "lastPosition"} for k, row in mongo_view(env.db).items()
            } == expected, 240, "the MongoDB view to catch up")
            assert restarted.is_alive(), f"the restarted job stopped by itself: {failures}"
        finally:
            stop_job.set()
            restarted.join(timeout=120)
    assert not failures, failures
    position_of = positions(read_topic(bootstrap, env.topic()))
    assert_view_equals_outbox(mongo_view(env.db), expected, position_of)
    assert_view_equals_outbox(parquet_view(spark, str(output / "state")), expected, position_of)
    ids = _event_table_ids(spark, output)
    assert len(ids) == len(set(ids)) == total and set(ids) == written.ids, "each event exactly once"

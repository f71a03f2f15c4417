"""The relay process is SIGKILLed at random points and restarted (docs/faults.md rows 1 and 2)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayProcess
from tests.support.soak import size
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events


@pytest.mark.soak
def test_relay_killed_five_times_during_a_run_loses_nothing_and_only_replays_after_checkpoint(env, tmp_path):
    """Five SIGKILLs of the relay at random points while four writers commit: nothing lost, order
    kept, every duplicate published by a later run and after the checkpoint that run resumed
    from. The suite writes at least 4,000 events (the soak 20,000), at a slower pace, and the
    writers go on until the last kill: every kill hits a run publishing a live backlog."""
    total, kills = size(4_000, 20_000), 5
    rng = random.Random(20_000)
    written, kills_done = Written(), threading.Event()
    # About 1,000 events/s (suite: 200) for ~20 s, in transactions of up to 5 events, from 4 writers.
    writer = threading.Thread(target=write_events, kwargs=dict(
        db=env.db, collection=env.settings.outbox_collection, total=total, writers=4, max_per_txn=5,
        written=written, pause=lambda: time.sleep(size(0.07, 0.01)), until=kills_done))
    writer.start()
    checkpoint_at_start: dict[int, str] = {}  # fencing token of a run -> token it resumed after
    runs: list[RelayProcess] = []
    try:
        for i in range(kills):
            settings = env.settings.replace(instance_id=f"run-{i}", pipeline_depth=1 + i % 3)
            before = (lease_doc(env.db, env.settings) or {}).get("resumeToken")
            proc = RelayProcess(settings, tmp_path, f"run-{i}").start()
            runs.append(proc)
            lease = wait_until(lambda: (d := lease_doc(env.db, env.settings)) and d.get("owner") == settings.instance_id
                               and d, 60, f"run {i} to take the lease")
            checkpoint_at_start[lease["fencingToken"]] = before["_data"] if before else ""
            time.sleep(rng.uniform(0.3, 3.0))
            proc.kill()
        final_settings = env.settings.replace(instance_id="final", pipeline_depth=3)
        before = lease_doc(env.db, env.settings)["resumeToken"]
        final = RelayProcess(final_settings, tmp_path, "final").start()
        runs.append(final)
        lease = wait_until(lambda: (d := lease_doc(env.db, env.settings)) and d.get("owner") == "final" and d,
                           60, "the final run to take the lease")
        checkpoint_at_start[lease["fencingToken"]] = before["_data"]
        kills_done.set()
        writer.join()

        def all_published():
            records = read_topic(env.servers.kafka_bootstrap, env.topic())
            return records if {r.id for r in records} >= written.ids else None
        records = wait_until(all_published, 180, "every event in the topic", interval=2)
        assert final.terminate() == 0, final.log()
    finally:
        kills_done.set()
        writer.join()
        for proc in runs:
            proc.stop()

    verdict = assert_complete_and_ordered(records, written)
    assert len(written.ids) >= total
    # A duplicate is published by a later run than the first copy, and only if it lies after
    # the checkpoint that run resumed from.
    for dup in verdict.duplicates:
        original = verdict.first[dup.id]
        assert dup.fencing > original.fencing, (dup, original)
        assert dup.position > checkpoint_at_start[dup.fencing], (
            f"event {dup.id} replayed by fencing token {dup.fencing} although it is before the "
            f"checkpoint that run resumed from")
    fencing_tokens = sorted({r.fencing for r in records})
    print(f"\n{total} events, {kills} kills, {len(verdict.duplicates)} duplicates, runs {fencing_tokens}")
    assert len(fencing_tokens) >= 3, "the kills should have hit runs that were publishing"


def test_a_relay_killed_during_a_catch_up_publishes_again_about_checkpoint_max_events_at_most(env, tmp_path):
    """Issue 50: the duplicate window is bounded by count too. A backlog is published with an
    interval too long to matter (60 s) and RELAY_CHECKPOINT_MAX_EVENTS=500; the relay is killed
    early in the catch-up. The next run publishes again at most the count, plus what was in
    flight (RELAY_BATCH_MAX_EVENTS) and one read past it; by the interval alone it would publish
    again everything the first run had delivered."""
    backlog, max_events, in_flight = 20_000, 500, 200
    written = write_events(env.db, env.settings.outbox_collection, total=backlog, writers=4, max_per_txn=100)
    settings = env.settings.replace(checkpoint_interval_ms=60_000, checkpoint_max_events=max_events,
                                    batch_max_events=in_flight)
    runs = [RelayProcess(settings.replace(instance_id="first"), tmp_path, "first").start()]
    try:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= backlog // 8, 120,
                   "an eighth of the backlog published", interval=0.02)
        runs[0].kill()
        delivered = topic_size(env.servers.kafka_bootstrap, env.topic())
        assert delivered < backlog, "killed during the catch-up"
        runs.append(RelayProcess(settings.replace(instance_id="second"), tmp_path, "second").start())
        records = wait_until(lambda: (r := read_topic(env.servers.kafka_bootstrap, env.topic()))
                             and {x.id for x in r} >= written.ids and r, 180, "every event in the topic", interval=1)
        assert runs[1].terminate() == 0, runs[1].log()
    finally:
        for proc in runs:
            proc.stop()
    verdict = assert_complete_and_ordered(records, written)
    bound = max_events + 2 * in_flight
    print(f"\n{backlog} events, killed after {delivered} delivered: {len(verdict.duplicates)} duplicates (bound {bound})")
    assert len(verdict.duplicates) <= bound, f"{len(verdict.duplicates)} published again after the kill"

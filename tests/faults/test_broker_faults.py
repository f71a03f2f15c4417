"""Kafka broker faults (FAULTS.md rows 10 and 11): the session's broker is killed or paused."""

from __future__ import annotations

import threading
import time

from tests.support import (
    CheckpointWatcher, RelayThread, Written, assert_complete_and_ordered, lease_doc, needs_local_stack,
    read_topic, wait_until, write_events,
)


def _all_published(env, written: Written, timeout: float = 180) -> list:
    def done():
        records = read_topic(env.servers.kafka_bootstrap, env.topic())
        return records if {r.id for r in records} >= written.ids else None
    return wait_until(done, timeout, "every event in the topic", interval=1)


def _background_writes(env, written: Written, total: int) -> threading.Thread:
    thread = threading.Thread(target=write_events, kwargs=dict(
        db=env.db, collection=env.settings.outbox_collection, total=total, writers=2, max_per_txn=4,
        written=written, pause=lambda: time.sleep(0.01)))
    thread.start()
    return thread


def test_broker_killed_and_restarted_loses_and_reorders_nothing(env):
    broker = needs_local_stack(env.servers).kafka
    written = Written()
    with RelayThread(env.settings) as relay, CheckpointWatcher(env.db, env.settings) as watcher:
        writer = _background_writes(env, written, 4000)
        wait_until(lambda: len(written.ids) > 1000, 60, "writes under way")
        broker.process.kill()
        time.sleep(3)
        broker.start()
        writer.join()
        records = _all_published(env, written)
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(records, written)
    watcher.assert_never_went_backwards()
    print(f"\nbroker SIGKILL + restart: {len(written.ids)} events, {len(verdict.duplicates)} duplicates")


def test_broker_paused_past_the_delivery_timeout_replays_from_the_checkpoint(env):
    broker = needs_local_stack(env.servers).kafka
    settings = env.settings.replace(kafka={"message.timeout.ms": "4000"})
    written = Written()
    with RelayThread(settings) as relay, CheckpointWatcher(env.db, settings) as watcher:
        writer = _background_writes(env, written, 3000)
        wait_until(lambda: len(written.ids) > 800, 60, "writes under way")
        broker.process.pause()
        try:
            time.sleep(9)  # more than twice message.timeout.ms: deliveries fail and are replayed
            stored = lease_doc(env.db, settings)["resumeToken"]
        finally:
            broker.process.resume()
        writer.join()
        records = _all_published(env, written)
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(records, written)
    watcher.assert_never_went_backwards()
    restarts = {s.labels["kind"] for m in relay.relay.observer.restarts.collect() for s in m.samples if s.value}
    assert restarts & {"DeliveryError", "KafkaException"}, f"delivery timeouts should restart: {restarts}"
    for dup in verdict.duplicates:
        assert dup.position > stored["_data"], "only events after the checkpoint are published again"
    print(f"\nbroker SIGSTOP 9 s: {len(written.ids)} events, {len(verdict.duplicates)} duplicates")

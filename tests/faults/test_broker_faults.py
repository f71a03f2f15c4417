"""Kafka broker faults (docs/faults.md rows 10 and 11): the session's broker is killed or paused."""

from __future__ import annotations

import time

from tests.support import (
    CheckpointWatcher, RelayThread, Written, all_published, assert_complete_and_ordered, background_writes,
    lease_doc, needs_local_stack, wait_until,
)




def test_broker_killed_and_restarted_loses_and_reorders_nothing(env):
    broker = needs_local_stack(env.servers).kafka
    written = Written()
    with RelayThread(env.settings) as relay, CheckpointWatcher(env.db, env.settings) as watcher:
        writer = background_writes(env, written, 4000)
        wait_until(lambda: len(written.ids) > 1000, 60, "writes under way")
        broker.process.kill()
        time.sleep(3)
        broker.start()
        writer.join()
        records = all_published(env, written)
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(records, written)
    watcher.assert_never_went_backwards()
    print(f"\nbroker SIGKILL + restart: {len(written.ids)} events, {len(verdict.duplicates)} duplicates")


def test_broker_paused_past_the_delivery_timeout_replays_from_the_checkpoint(env):
    broker = needs_local_stack(env.servers).kafka
    settings = env.settings.replace(kafka={"message.timeout.ms": "4000"})
    written = Written()
    with RelayThread(settings) as relay, CheckpointWatcher(env.db, settings) as watcher:
        writer = background_writes(env, written, 3000)
        wait_until(lambda: len(written.ids) > 800, 60, "writes under way")
        broker.process.pause()
        try:
            # Deliveries time out (message.timeout.ms) and the relay restarts from the checkpoint.
            wait_until(lambda: relay.metric_labels("relay_restarts_total", "kind") & {"DeliveryError", "KafkaException"},
                       60, "a delivery timeout to restart the relay")
            stored = lease_doc(env.db, settings)["resumeToken"]
        finally:
            broker.process.resume()
        writer.join()
        records = all_published(env, written)
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(records, written)
    watcher.assert_never_went_backwards()
    for dup in verdict.duplicates:
        assert dup.position > stored["_data"], "only events after the checkpoint are published again"
    print(f"\nbroker SIGSTOP past the delivery timeout: {len(written.ids)} events, {len(verdict.duplicates)} duplicates")

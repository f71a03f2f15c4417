"""Kafka broker faults (docs/faults.md rows 10 and 11): the session's broker is killed or paused."""

from __future__ import annotations

import time

import pytest

from tests.support.leases import CheckpointWatcher, lease_doc
from tests.support.oracle import all_published, assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.servers import needs_local_stack
from tests.support.topics import read_messages
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes


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
            # Messages time out (message.timeout.ms) and the relay restarts from the checkpoint.
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


@pytest.mark.parametrize("wait", ["poll", "drain"])
def test_a_timed_out_message_lets_no_later_message_of_its_partition_through(env, wait):
    """librdkafka drains and bumps the epoch after a message times out, then sends what was queued
    behind it; the publisher drops that queue at the first failed report, so no later event of the
    partition is written ahead of the replay of the earlier one (docs/faults.md, row 11). The
    same whether the loop waits by polling or by draining (Publisher.drain, which flushes)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from relay.core.message import OutgoingMessage
    from relay.core.window import Parcel
    from relay.kafka.producer import IdempotentPublisher

    broker = needs_local_stack(env.servers).kafka
    topic = env.topic()
    with AdminClient({"bootstrap.servers": env.servers.kafka_bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    settings = env.settings.replace(kafka={"message.timeout.ms": "3000", "linger.ms": "0"})
    publisher = IdempotentPublisher(settings.parts().kafka.producer_config())
    message = lambda i: OutgoingMessage(f"e{i}", topic, b"k", f"v{i}".encode(), [])  # noqa: E731
    publisher.poll(5)  # connected
    first = Parcel([-1], [message(0)], None, 0.0)
    later = Parcel([-1] * 9, [message(i) for i in range(1, 10)], None, 0.0)
    broker.process.pause()
    try:
        publisher.send(first, lambda: None)
        time.sleep(2.5)  # the later messages would time out 2.5 s after the first
        publisher.send(later, lambda: None)
        wait_until(lambda: getattr(publisher, wait)(0.05) or first.done, 30, "the first message to time out")
    finally:
        broker.process.resume()
    wait_until(lambda: getattr(publisher, wait)(0.05) or later.done, 30, "the later messages' reports")
    publisher.close()
    assert first.failure is not None, "the first message was acknowledged while the broker was paused"
    assert later.failure is not None, f"the later messages were acknowledged after the first failed: {first.failure}"
    values = {m.value() for m in read_messages(env.servers.kafka_bootstrap, topic, timeout=10)}
    assert b"v0" in values or not values, f"a gap: {sorted(values)} were written, v0 was not"


def test_a_refused_record_batch_lets_no_later_message_of_its_partition_through(env):
    """A batch the broker refuses for good (larger than the topic accepts) is a gap in the
    partition's sequence. Left to itself librdkafka would drain, bump the epoch and send the
    messages behind the gap before the loop serves the failed report; the forced
    `enable.gapless.guarantee` makes the refusal stop the producer instead (docs/faults.md,
    "Delivery errors"). The loop here is slow on purpose: it serves no report for two seconds."""
    import os

    from confluent_kafka.admin import AdminClient, NewTopic

    from relay.core.errors import BatchRefusedError
    from relay.core.message import OutgoingMessage
    from relay.core.window import Parcel
    from relay.kafka.producer import IdempotentPublisher

    topic = env.topic()
    with AdminClient({"bootstrap.servers": env.servers.kafka_bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "20000"})])[topic].result(timeout=30)
    # One message per request, so the messages behind the refused one are requests of their own.
    settings = env.settings.replace(kafka={"linger.ms": "0", "batch.num.messages": "1"})
    publisher = IdempotentPublisher(settings.parts().kafka.producer_config())
    values = [b"v0", os.urandom(50_000), *(f"v{i}".encode() for i in range(2, 10))]
    messages = [OutgoingMessage(f"e{i}", topic, b"k", v, []) for i, v in enumerate(values)]
    parcel = Parcel([-1] * len(values), messages, None, 0.0)
    publisher.poll(5)  # connected
    publisher.send(parcel, lambda: None)
    time.sleep(2)  # a busy loop: no report served, no purge
    wait_until(lambda: publisher.poll(0.05) or parcel.done, 30, "every report")
    later = Parcel([-1], [OutgoingMessage("e10", topic, b"k", b"v10", [])], None, 0.0)
    publisher.send(later, lambda: None)  # a producer stopped at a gap takes nothing more
    publisher.close()
    assert parcel.failure is not None, "the broker took a message larger than the topic accepts"
    assert isinstance(publisher.failure(parcel), BatchRefusedError), publisher.failure(parcel)
    assert later.done and isinstance(publisher.failure(later), BatchRefusedError), publisher.failure(later)
    written = [m.value() for m in read_messages(env.servers.kafka_bootstrap, topic, timeout=10)]
    assert written in ([], [b"v0"]), f"written behind the refused message: {written}"

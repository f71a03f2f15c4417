"""The at-least-once publisher against a real broker: what the loop relies on when it waits."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from relay.core.message import OutgoingMessage
from relay.core.window import Parcel
from relay.kafka.producer import IdempotentPublisher
from tests.support.topics import read_messages


def test_drain_sends_at_once_what_linger_holds_back(env):
    """The loop hands a whole batch over, then waits for every report: `drain` (librdkafka's
    flush) sends what linger.ms would hold back, so an acknowledgement never waits for a batch
    to fill that nothing more will join. With a one-minute linger, polling leaves the message
    unsent; draining delivers it."""
    topic = env.topic()
    with AdminClient({"bootstrap.servers": env.servers.kafka_bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    settings = env.settings.replace(kafka={"linger.ms": "60000", "message.timeout.ms": "300000"})
    publisher = IdempotentPublisher(settings.parts().kafka.producer_config())
    try:
        parcel = Parcel([-1], [OutgoingMessage("e1", topic, b"k", b"v1", [])], None, 0.0)
        publisher.send(parcel, lambda: None)
        publisher.poll(2)
        assert not parcel.done, "linger.ms held the message back while polling"
        publisher.drain(30)
        assert parcel.done and parcel.failure is None
    finally:
        publisher.close()
    assert [m.value() for m in read_messages(env.servers.kafka_bootstrap, topic, timeout=10)] == [b"v1"]

"""The inbox's RabbitMQ side without a server: its options, a delivery as the steps take it, how a
gather takes deliveries (relay.inbox.rabbitmq; the server tests are tests/rabbitmq/test_rabbitmq_inbox.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from relay.core.errors import ConfigError
from relay.inbox.batching import offsets_to_commit
from relay.inbox.config import RunOptions
from relay.inbox.rabbitmq import _take, received

URL = "amqp://shipping:s3cret-pass@rabbit:5672/%2F"


def options(topics=("shipping.orders",), **more):
    return RunOptions.of(list(topics), "shipping", None, {"rabbitmq_url": URL, **more})


def test_rabbitmq_url_chooses_the_broker_and_is_shown_masked():
    o = options(rabbitmq_bindings=["outbox.event.order"])
    assert o.broker == "rabbitmq" and o.rabbitmq_bindings == ("outbox.event.order",)
    assert "s3cret-pass" not in repr(o) and "shipping:***@rabbit" in repr(o)


@pytest.mark.parametrize("more, topics, named", [
    ({"rabbitmq_url": "http://rabbit"}, ("q",), "rabbitmq_url"),
    ({"rabbitmq_exchange": ""}, ("q",), "rabbitmq_exchange"),
    ({"rabbitmq_bindings": "outbox.#"}, ("q",), "rabbitmq_bindings"),
    ({}, ("q1", "q2"), "topics"),
    ({"nats_servers": "nats://n:4222"}, ("q",), "bootstrap_servers"),
])
def test_bad_rabbitmq_options_are_refused_naming_the_option(more, topics, named):
    with pytest.raises(ConfigError) as refused:
        options(topics, **more)
    assert refused.value.setting == named


def test_a_delivery_is_the_routing_key_partition_0_the_delivery_tag_and_the_aggregate_id():
    method = SimpleNamespace(routing_key="outbox.event.order", delivery_tag=7)
    properties = SimpleNamespace(headers={"relay_aggregate_id": "o-1", "ce_id": "e-1", "raw": b"\xff", "n": 3})
    msg = received(method, properties, b"body")
    assert (msg.topic, msg.partition, msg.offset, msg.key, msg.value) == ("outbox.event.order", 0, 7, b"o-1", b"body")
    assert dict(msg.raw_headers) == {"relay_aggregate_id": "o-1", "ce_id": "e-1", "raw": b"\xff", "n": "3"}
    assert offsets_to_commit([msg, received(SimpleNamespace(routing_key="outbox.event.x", delivery_tag=9),
                                            properties, b"")]) == {("outbox.event.order", 0): 8, ("outbox.event.x", 0): 10}


def test_a_gather_takes_what_is_at_hand_up_to_its_room_and_stops_at_a_closed_channel():
    async def scenario():
        queue = asyncio.Queue()
        for tag in (1, 2, 3):
            queue.put_nowait(tag)
        first = await _take(queue, 2, 0.1)
        rest = await _take(queue, 10, 0.1)
        idle = await _take(queue, 10, 0.05)
        queue.put_nowait(4)
        queue.put_nowait(None)  # the channel closed
        before_close = await _take(queue, 10, 0.1)
        after_close = await _take(queue, 10, 0.1)
        return first, rest, idle, before_close, after_close, queue.qsize()

    first, rest, idle, before_close, after_close, left = asyncio.run(scenario())
    assert (first, rest, idle) == ([1, 2], [3], [])
    assert (before_close, after_close, left) == ([4], [], 1), "the closed marker stays for the next gather"

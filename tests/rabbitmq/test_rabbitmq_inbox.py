"""The inbox on a RabbitMQ queue (relay.inbox.rabbitmq; docs/rabbitmq.md, "Consumers"), against real
servers: the relay publishes to the exchange, a consumer applies the events from a quorum queue
with a single active consumer, both forms of the inbox (`Inbox`, `AsyncInbox`), on a queue the
operator made or one the inbox declares. The effects are checked against the outbox: every event
applied exactly once, per aggregate in commit order (tests/inbox_support.py)."""

from __future__ import annotations

import logging
import random
import time

import pytest

from relay.core.errors import ConfigError
from tests.inbox_support import (
    InboxProcess,
    applied_count,
    assert_effects_exactly_once_in_order,
    consumer,
    wait_applied,
)
from tests.support.rabbitmq import QueueReader, bind_queue, queue_exists
from tests.support.relays import RelayThread
from tests.support.soak import size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes, write_events


def run_options(renv, **more):
    return dict(topics=[renv.queue], group_id="shipping", rabbitmq_url=renv.server.url,
                rabbitmq_exchange=renv.exchange, connect_timeout_s=15.0, **more)


@pytest.mark.parametrize("form, declares", [("sync", True), ("async", False)], ids=["sync-declared", "async-operator"])
def test_the_inbox_applies_every_event_once_in_order_from_a_quorum_queue(renv, form, declares):
    """`sync`: the inbox declares its queue and binds it (`rabbitmq_bindings`) before the relay
    starts; `async`: the operator's queue. A restart is delivered nothing again: all acknowledged."""
    written = write_events(renv.db, renv.settings.outbox_collection, total=300, writers=3)
    run = run_options(renv, rabbitmq_bindings=["outbox.event.*"]) if declares else run_options(renv)
    if not declares:
        renv.bind(single_active=True)
    with consumer(form, renv, **run) as c:
        wait_until(lambda: queue_exists(renv.server.url, renv.queue), 60, "the queue", alive=c.check_alive)
        with RelayThread(renv.settings) as relay:
            wait_applied(renv.db, 300, alive=c.check_alive)
        assert relay.error is None, relay.error
        assert c.error is None
    with consumer(form, renv, **run) as c:
        time.sleep(3)
        c.check_alive()
        assert c.metric("relay_inbox_batches_total") == 0, "nothing delivered again"
    assert applied_count(renv.db) == 300
    assert_effects_exactly_once_in_order(renv.db, written)


def test_a_missing_queue_stops_the_inbox_naming_it_and_one_without_a_single_active_consumer_is_warned_of(
        renv, caplog):
    with consumer("sync", renv, **run_options(renv)) as c:
        c.thread.join(timeout=60)
    assert isinstance(c.error, ConfigError) and str(c.error).startswith("topics: ")
    assert f"has no queue {renv.queue}" in str(c.error) and "guest:***@" in str(c.error)
    bind_queue(renv.server.url, renv.queue, renv.exchange)  # a quorum queue, no single active consumer
    with caplog.at_level(logging.WARNING, logger="relay.inbox"), consumer("sync", renv, **run_options(renv)) as c:
        wait_until(lambda: "x-single-active-consumer" in caplog.text, 30, "the warning", alive=c.check_alive)
    assert f"queue {renv.queue} is not a quorum queue with x-single-active-consumer" in caplog.text
    assert "run one inbox process on it" in caplog.text


def test_a_poison_event_is_dead_lettered_to_the_exchange_and_the_rest_applied(renv):
    renv.bind(single_active=True)
    dead = QueueReader(renv.server.url, f"dl{renv.tag}")
    bind_queue(renv.server.url, dead.queue, renv.exchange, ("outbox.deadletter",))
    written = write_events(renv.db, renv.settings.outbox_collection, total=40, writers=1)
    poison = next(iter(written.per_aggregate.values()))[1]
    with consumer("sync", renv, fail_on=lambda e: e.event_id == poison,
                  **run_options(renv, on_poison="dead-letter")) as c, RelayThread(renv.settings):
        wait_applied(renv.db, 39, alive=c.check_alive)
        letters = wait_until(lambda: dead.read(decode=False), 30, "the dead letter")
    assert c.error is None
    [letter] = letters
    assert letter.properties.message_id == poison == letter.headers["ce_id"]
    assert letter.topic == "outbox.deadletter" and "refusing" in letter.headers["relay_dead_letter_reason"]
    assert letter.headers["relay_inbox_group"] == "shipping" and letter.body[:2] == b"\xc3\x01"
    assert_effects_exactly_once_in_order(renv.db, written, except_ids={poison})


@pytest.mark.soak
@pytest.mark.parametrize("form", ["sync", "async"])
def test_the_inbox_on_a_quorum_queue_sigkilled_and_restarted_applies_every_event_once_in_order(
        renv, tmp_path, form, short_transaction_lifetime):
    """Four SIGKILLs of a consumer process at random moments while the relay publishes a backlog:
    RabbitMQ returns the killed one's unacknowledged batch to the queue ahead of the rest, the next
    process gets it first and skips what its MongoDB transaction had recorded. The suite writes
    1,500 events (the soak 3,000)."""
    total = size(1_500, 3_000)
    written, rng = Written(), random.Random(53)
    renv.bind(single_active=True)
    service = InboxProcess(tmp_path / "inbox.log", renv.settings.mongodb_uri, renv.settings.database, renv.queue,
                           "shipping", renv.server.url, form=form, rabbitmq_exchange=renv.exchange)
    with RelayThread(renv.settings):
        writer = background_writes(renv, written, total, writers=3, pause=0.004)
        service.start()
        try:
            for _ in range(4):
                target = applied_count(renv.db) + rng.randint(total // 20, total // 8)
                wait_until(lambda: applied_count(renv.db) >= target, 90, "the consumer at work", interval=0.05)
                service.kill()
                service.start()
            writer.join()
            wait_applied(renv.db, len(written.ids), timeout=120)
        finally:
            service.stop()
    assert_effects_exactly_once_in_order(renv.db, written)

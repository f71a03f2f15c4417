"""The inbox on NATS JetStream (relay.inbox.jetstream; docs/nats.md, "Consumers"), against real
servers: the relay publishes to a stream, a consumer applies the events through a durable pull
consumer, both forms of the inbox (`Inbox`, `AsyncInbox`). The effects are checked against the
outbox: every event applied exactly once, per aggregate in commit order (tests/inbox_support.py)."""

from __future__ import annotations

import random
import time

import pytest

from tests.inbox_support import (
    FORMS,
    InboxProcess,
    applied_count,
    assert_effects_exactly_once_in_order,
    consumer,
    wait_applied,
)
from tests.support.relays import RelayThread
from tests.support.soak import size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes, write_events


@pytest.mark.parametrize("form", FORMS)
def test_the_inbox_applies_every_event_once_in_order_from_a_durable_consumer(nenv, form):
    written = write_events(nenv.db, nenv.settings.outbox_collection, total=300, writers=3)
    run = dict(topics=[f"t{nenv.tag}.event.*"], group_id="shipping", nats_servers=nenv.server.url,
               nats_stream=nenv.stream)
    with RelayThread(nenv.settings):
        wait_until(lambda: nenv.size() >= 300, 60, "the events in the stream")
        with consumer(form, nenv, **run) as c:
            wait_applied(nenv.db, 300, alive=c.check_alive)
            assert c.error is None
        with consumer(form, nenv, **run) as c:  # a restart is delivered nothing again: all acknowledged
            time.sleep(3)
            c.check_alive()
            assert c.metric("relay_inbox_batches_total") == 0, "nothing delivered again"
    assert applied_count(nenv.db) == 300
    assert_effects_exactly_once_in_order(nenv.db, written)


@pytest.mark.soak
@pytest.mark.parametrize("form", FORMS)
def test_the_inbox_on_jetstream_sigkilled_and_restarted_applies_every_event_once_in_order(
        nenv, tmp_path, form, short_transaction_lifetime):
    """Four SIGKILLs of a consumer process at random moments while the relay publishes a backlog:
    the next process gets the killed one's unacknowledged batch again first (after ack_wait, 2 s
    here) and skips what its MongoDB transaction had recorded. The suite writes 1,500 events (the
    soak 3,000)."""
    total = size(1_500, 3_000)
    written, rng = Written(), random.Random(53)
    service = InboxProcess(tmp_path / "inbox.log", nenv.settings.mongodb_uri, nenv.settings.database,
                           f"t{nenv.tag}.event.*", "shipping", nenv.server.url, form=form, nats_stream=nenv.stream)
    with RelayThread(nenv.settings):
        writer = background_writes(nenv, written, total, writers=3, pause=0.004)
        service.start()
        try:
            for _ in range(4):
                target = applied_count(nenv.db) + rng.randint(total // 20, total // 8)
                wait_until(lambda: applied_count(nenv.db) >= target, 90, "the consumer at work", interval=0.05)
                service.kill()
                service.start()
            writer.join()
            wait_applied(nenv.db, len(written.ids), timeout=120)
        finally:
            service.stop()
    assert_effects_exactly_once_in_order(nenv.db, written)

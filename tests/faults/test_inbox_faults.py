"""The inbox under faults, on real servers: a consumer process SIGKILLed mid-run and restarted,
the Kafka broker SIGKILLed and restarted, and a MongoDB primary step-down on a three-member
replica set. Each checks the effects against
the outbox: every event applied exactly once, per aggregate in commit order (tests/inbox_support.py).
"""

from __future__ import annotations

import random
import time

import pymongo
import pytest
from pymongo.errors import PyMongoError

from tests.inbox_support import (
    InboxProcess,
    InboxThread,
    applied_count,
    assert_effects_exactly_once_in_order,
    effects_handler,
    wait_applied,
)
from tests.support import RelayThread, Written, background_writes, needs_local_stack, wait_until


@pytest.fixture
def short_transaction_lifetime(env):
    """A killed consumer's open transaction keeps its write locks until the server aborts it
    (transactionLifetimeLimitSeconds, 60 s by default): its successor's transactions on the same
    documents conflict and retry until then. 5 s here keeps the test short; restored after."""
    admin = env.client.admin
    before = admin.command("getParameter", 1, transactionLifetimeLimitSeconds=1)["transactionLifetimeLimitSeconds"]
    admin.command("setParameter", 1, transactionLifetimeLimitSeconds=5)
    try:
        yield
    finally:
        admin.command("setParameter", 1, transactionLifetimeLimitSeconds=before)


def test_consumer_sigkilled_mid_run_and_restarted_applies_every_event_once_in_order(env, tmp_path,
                                                                                    short_transaction_lifetime):
    written = Written()
    rng = random.Random(27)
    service = InboxProcess(tmp_path / "inbox.log", env.servers.mongodb_uri, env.settings.database, env.topic(),
                           "shipping", env.servers.kafka_bootstrap)
    with RelayThread(env.settings):
        writer = background_writes(env, written, 3000, writers=3, pause=0.004)
        service.start()
        try:
            for _ in range(4):
                target = applied_count(env.db) + rng.randint(100, 400)
                wait_until(lambda: applied_count(env.db) >= target, 90, "the consumer at work", interval=0.05)
                service.kill()  # anywhere: in a transaction, between its commit and the offset commit, ...
                service.start()
            writer.join()
            wait_applied(env.db, 3000, timeout=120)
        finally:
            service.stop()
    assert_effects_exactly_once_in_order(env.db, written)
    assert applied_count(env.db) == 3000, service.log_path.read_text()[-2000:]


def test_broker_killed_and_restarted_mid_run_applies_every_event_once_in_order(env):
    broker = needs_local_stack(env.servers).kafka
    written = Written()
    run = dict(topics=[env.topic()], group_id="shipping", bootstrap_servers=env.servers.kafka_bootstrap,
               batch_max_events=100)
    with RelayThread(env.settings), InboxThread(env.db, effects_handler(env.db), **run) as inbox:
        writer = background_writes(env, written, 2000, writers=3, pause=0.005)
        wait_applied(env.db, 500, alive=inbox.check_alive)
        broker.process.kill()  # offset commits fail or wait; the inbox records stay
        time.sleep(2)
        broker.start()
        writer.join()
        wait_applied(env.db, 2000, timeout=120, alive=inbox.check_alive)
    assert_effects_exactly_once_in_order(env.db, written)


def test_primary_step_down_mid_run_applies_every_event_once_in_order(env3, rs3):
    written = Written()
    run = dict(topics=[env3.topic()], group_id="shipping", bootstrap_servers=env3.servers.kafka_bootstrap,
               batch_max_events=100)
    with RelayThread(env3.settings), InboxThread(env3.db, effects_handler(env3.db), **run) as inbox:
        writer = background_writes(env3, written, 2000, writers=3, pause=0.005)
        wait_applied(env3.db, 500, alive=inbox.check_alive)
        with pymongo.MongoClient(rs3.uri) as client:
            try:
                client.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
            except PyMongoError:
                pass  # the primary closes connections as it steps down
        writer.join()
        wait_applied(env3.db, 2000, timeout=120, alive=inbox.check_alive)
    assert_effects_exactly_once_in_order(env3.db, written)
    print(f"\nstep-down: {inbox.metric('relay_inbox_transaction_retries_total'):.0f} transaction retries")

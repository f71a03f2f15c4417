"""The inbox under faults, on real servers: a consumer process SIGKILLed mid-run and restarted
(at random moments, and aimed between a batch's MongoDB commit and its Kafka offset commit), the
Kafka broker SIGKILLed and restarted, and a MongoDB primary step-down on a three-member replica
set (checked to have elected another primary). Each checks the effects against the outbox: every
event applied exactly once, per aggregate in commit order (tests/inbox_support.py). Each runs with
both forms of the inbox, `Inbox` and `AsyncInbox` (`form`).
"""

from __future__ import annotations

import random
import time

import pymongo
import pytest
from pymongo.errors import ConnectionFailure, PyMongoError

from tests.inbox_support import (
    FORMS,
    InboxProcess,
    applied_count,
    assert_effects_exactly_once_in_order,
    consumer,
    recorded_not_committed,
    wait_applied,
)
from tests.support.mongodb import transaction_lifetime
from tests.support.relays import RelayThread
from tests.support.servers import needs_local_stack
from tests.support.soak import size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes

# Events per run: the suite's size still lets every kill, the broker's restart and the election land
# while the consumer has a backlog to apply (each waits for progress first, then asserts it is not done).
KILL_RUN = size(1_500, 3_000)
FAULT_RUN = size(1_000, 2_000)


@pytest.fixture
def short_transaction_lifetime(env):
    """A killed consumer's open transaction keeps its write locks until the server aborts it
    (transactionLifetimeLimitSeconds, 60 s by default): its successor's transactions on the same
    documents conflict and retry until then. 5 s here keeps the test short; restored after."""
    with transaction_lifetime(env.client, 5):
        yield


@pytest.mark.soak
@pytest.mark.parametrize("form", FORMS)
def test_consumer_sigkilled_mid_run_and_restarted_applies_every_event_once_in_order(env, tmp_path, form,
                                                                                    short_transaction_lifetime):
    """Six kills: three at random moments, three aimed into the window between a batch's MongoDB
    commit and its Kafka offset commit, where the restarted consumer must skip the events it reads
    again (that window is widened to 0.3 s, tests/inbox_service.py, only in the processes that get
    an aimed kill: the others commit at full speed, to be killed anywhere). After each kill the
    test counts the records past the group's committed offsets: the kill landed in the window when
    some are."""
    written = Written()
    rng = random.Random(27)
    # A group of this test's own: a SIGKILLed consumer stays a member of its group until its session
    # times out (45 s), and a group whose stale members subscribed to another topic (this test's
    # other form, on the same broker) was seen assigning the new consumer that topic's partitions.
    topic = env.topic()
    group = f"shipping-{topic}"
    service = InboxProcess(tmp_path / "inbox.log", env.servers.mongodb_uri, env.settings.database, topic,
                           group, env.servers.kafka_bootstrap, form=form)
    left_in_window: list[int] = []
    with RelayThread(env.settings):
        writer = background_writes(env, written, KILL_RUN, writers=3, pause=0.004)
        service.start()
        try:
            for kill in range(6):
                step = KILL_RUN // 30  # 6 kills, each after 1-3 steps of progress
                target = applied_count(env.db) + rng.randint(step, 3 * step)
                wait_until(lambda: applied_count(env.db) >= target, 90, "the consumer at work", interval=0.05)
                if kill % 2:  # aimed: once a transaction committed whose offsets are not committed yet
                    wait_until(lambda: recorded_not_committed(env.db, env.servers.kafka_bootstrap, topic, group),
                               30, "a batch between its two commits", interval=0.02)
                service.kill()
                left_in_window.append(recorded_not_committed(env.db, env.servers.kafka_bootstrap, topic, group))
                service.commit_delay_s = 0.3 if kill % 2 == 0 else 0.0  # the next kill is aimed
                service.start()
            writer.join()
            wait_applied(env.db, KILL_RUN, timeout=120)
        finally:
            service.stop()
    assert_effects_exactly_once_in_order(env.db, written)
    assert applied_count(env.db) == KILL_RUN, service.log_path.read_text()[-2000:]
    # At least one kill left recorded events uncommitted in Kafka: the next consumer read them
    # again and skipped them (the effects above are exact), which is the inbox's reason to be.
    assert any(left_in_window), left_in_window
    print(f"\nkills ({form}): events recorded but not committed to Kafka at each kill: {left_in_window}")


@pytest.mark.soak
@pytest.mark.parametrize("form", FORMS)
def test_broker_killed_and_restarted_mid_run_applies_every_event_once_in_order(env, form):
    broker = needs_local_stack(env.servers).kafka
    written = Written()
    run = dict(topics=[env.topic()], group_id="shipping", bootstrap_servers=env.servers.kafka_bootstrap,
               batch_max_events=100)
    with RelayThread(env.settings), consumer(form, env, **run) as inbox:
        writer = background_writes(env, written, FAULT_RUN, writers=3, pause=0.005)
        wait_applied(env.db, FAULT_RUN // 4, alive=inbox.check_alive)
        broker.process.kill()  # offset commits fail or wait; the inbox records stay
        time.sleep(2)
        broker.start()
        writer.join()
        wait_applied(env.db, FAULT_RUN, timeout=120, alive=inbox.check_alive)
    assert_effects_exactly_once_in_order(env.db, written)


def _primary(rs) -> int | None:
    """The member that says it is the writable primary, None while there is none."""
    for index, port in enumerate(rs.ports):
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                 serverSelectionTimeoutMS=2000) as member:
            try:
                if member.admin.command("hello").get("isWritablePrimary"):
                    return index
            except PyMongoError:
                continue
    return None


def _step_down(rs) -> tuple[int, int | None]:
    """Step the primary down; (the old primary, the new one). Fails the test when the command
    fails other than by closing the connection, or when no other member is elected within the
    step-down period (10 s: member 0, of a higher priority, may then take over again)."""
    before = _primary(rs)
    assert before is not None, "no primary before the step-down"
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{rs.ports[before]}/?directConnection=true") as primary:
        try:
            primary.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
        except ConnectionFailure:
            pass  # the primary may close connections as it steps down: the election is checked below
    wait_until(lambda: _primary(rs) not in (None, before), 9, "another member elected primary")
    return before, _primary(rs)


@pytest.mark.soak
@pytest.mark.parametrize("form", FORMS)
def test_primary_step_down_mid_run_applies_every_event_once_in_order(env3, rs3, form):
    written = Written()
    run = dict(topics=[env3.topic()], group_id="shipping", bootstrap_servers=env3.servers.kafka_bootstrap,
               batch_max_events=100)
    with RelayThread(env3.settings), consumer(form, env3, **run) as inbox:
        writer = background_writes(env3, written, FAULT_RUN, writers=3, pause=0.005)
        wait_applied(env3.db, FAULT_RUN // 4, alive=inbox.check_alive)
        old, new = _step_down(rs3)
        at_election = applied_count(env3.db)
        assert at_election < FAULT_RUN, "the step-down came after the inbox had applied everything"
        writer.join()
        # The inbox keeps going on the new primary (after retrying, if a transaction was cut).
        wait_applied(env3.db, FAULT_RUN, timeout=120, alive=inbox.check_alive)
    assert_effects_exactly_once_in_order(env3.db, written)
    retries = inbox.metric("relay_inbox_transaction_retries_total")
    print(f"\nstep-down ({form}): primary {old} -> {new}, applied {at_election} at the election, "
          f"{retries:.0f} retries")

"""Exactly-once mode under faults (docs/faults.md rows 16-18): the relay SIGKILLed inside
transactions, a zombie leader fenced by the broker, the broker killed mid-transaction.

The oracle is read with read_committed, what consumers of this mode use: every event exactly once
(no duplicate at all, unlike at-least-once), first occurrences per key in commit order. A
read_uncommitted reader is shown the aborted copies too; the tests report how many.

The relays run `python -m tests.faults.slow_commit run` (the relay with a pause between a
transaction's messages reaching the log, or being queued, and its commit), so that faults aimed
inside a transaction land there.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered, written_after_first_of
from tests.support.relays import RelayProcess
from tests.support.servers import needs_local_stack
from tests.support.soak import size
from tests.support.topics import read_topic, topic_size, uncommitted_messages
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes, write_events

SLOW_COMMIT = "tests.faults.slow_commit"
MARKER = "slow_commit: transaction open"


def eos(env, **changes):
    prefix = env.settings.topic_template.split(".")[0]
    return env.settings.replace(delivery="exactly-once", offsets_topic=f"{prefix}.offsets", **changes)


def _leader(env, instance: str, timeout: float = 60) -> dict:
    return wait_until(lambda: (d := lease_doc(env.db, env.settings)) and d.get("owner") == instance and d,
                      timeout, f"{instance} to hold the lease")


def _inside_a_transaction(env, timeout: float = 30) -> None:
    wait_until(lambda: uncommitted_messages(env.servers.kafka_bootstrap, env.topic()) > 0, timeout,
               "an open transaction with messages in the log", interval=0.05)


def _pause_inside_a_transaction(env, relay: RelayProcess, attempts: int = 5) -> None:
    """SIGSTOP `relay` while its Kafka transaction is open with messages in the log.

    Paused as soon as its log shows MARKER (printed after the flush, before the commit's delay),
    then checked: if the commit got in first (the check of the log came late), resumed and tried
    on the next transaction."""
    for _ in range(attempts):
        seen = relay.log().count(MARKER)
        wait_until(lambda: relay.log().count(MARKER) > seen, 30, "a transaction open", interval=0.02)
        relay.pause()
        if uncommitted_messages(env.servers.kafka_bootstrap, env.topic()) > 0:
            return
        relay.resume()
    raise AssertionError(f"no pause landed inside a transaction in {attempts} attempts")


def _all_visible(env, written: Written, timeout: float = 180):
    def done():
        records = read_topic(env.servers.kafka_bootstrap, env.topic())
        return records if {r.id for r in records} >= written.ids else None
    return wait_until(done, timeout, "every event visible to read_committed", interval=1)


def _exactly_once(records, written):
    verdict = assert_complete_and_ordered(records, written)
    assert not verdict.duplicates, (
        f"{len(verdict.duplicates)} events visible twice to read_committed, e.g. {verdict.duplicates[:3]}")
    return verdict


def _aborted_copies(env, records) -> int:
    return len(read_topic(env.servers.kafka_bootstrap, env.topic(), isolation="read_uncommitted")) - len(records)


@pytest.mark.soak
def test_relay_killed_five_times_inside_transactions_during_a_run_publishes_each_event_once(env, tmp_path):
    """Five SIGKILLs, three aimed while a transaction's messages are in the log uncommitted:
    read_committed sees every event exactly once, in order. The suite writes at least 4,000 events
    (the soak 20,000), at a slower pace, and the writers go on until the last kill: every kill lands
    in a run publishing a live backlog."""
    total, kills = size(4_000, 20_000), 5
    rng = random.Random(12)
    settings = eos(env)
    written, kills_done = Written(), threading.Event()
    writer = threading.Thread(target=write_events, daemon=True, kwargs=dict(
        db=env.db, collection=env.settings.outbox_collection, total=total, writers=4, max_per_txn=5,
        written=written, pause=lambda: time.sleep(size(0.07, 0.01)), until=kills_done))
    writer.start()
    runs: list[RelayProcess] = []
    inside = 0
    try:
        for i in range(kills):
            before = (lease_doc(env.db, env.settings) or {}).get("resumeToken")
            proc = RelayProcess(settings.replace(instance_id=f"run-{i}"), tmp_path, f"run-{i}",
                                module=SLOW_COMMIT).start()
            runs.append(proc)
            _leader(env, f"run-{i}")
            wait_until(lambda: (lease_doc(env.db, env.settings) or {}).get("resumeToken") != before, 60,
                       f"run {i} to commit a transaction")
            time.sleep(rng.uniform(0.0, 1.5))
            if i % 2 == 0:  # kills 0, 2, 4: while a transaction's messages are in the log, uncommitted
                _inside_a_transaction(env)
                inside += 1
            proc.kill()
        final = RelayProcess(settings.replace(instance_id="final"), tmp_path, "final", module=SLOW_COMMIT).start()
        runs.append(final)
        kills_done.set()
        writer.join()
        records = _all_visible(env, written)
        assert final.terminate() == 0, final.log()
    finally:
        kills_done.set()
        writer.join()
        for proc in runs:
            proc.stop()
    assert len(written.ids) >= total
    _exactly_once(records, written)
    aborted = _aborted_copies(env, records)
    fencing_tokens = sorted({r.fencing for r in records})
    print(f"\n{total} events, {kills} kills ({inside} aimed inside a transaction), 0 duplicates visible to "
          f"read_committed, {aborted} aborted copies visible to read_uncommitted, runs {fencing_tokens}")
    assert aborted > 0, "the kills inside transactions left aborted messages in the log"
    assert len(fencing_tokens) >= 3, "the kills should have hit runs that were publishing"


def test_relay_killed_inside_a_transaction_spanning_several_reads_resumes_after_the_last_commit(env, tmp_path):
    """A transaction spans reads of at most 50 events: 300 events are
    published and committed (the stream goes idle), then writes trickle in and the relay is
    SIGKILLed once more than 200 messages of the open transaction (open up to 20 s) are in the log (at least five
    reads). None of them is visible; the MongoDB checkpoint covers none of them; the next leader
    resumes after the last committed transaction and each event is visible once."""
    settings = eos(env, batch_max_events=50, transaction_max_events=100_000, transaction_max_ms=20_000)
    written = Written()
    a = RelayProcess(settings.replace(instance_id="A"), tmp_path, "A").start()
    b = RelayProcess(settings.replace(instance_id="B"), tmp_path, "B")
    try:
        _leader(env, "A")
        write_events(env.db, env.settings.outbox_collection, 300, writers=2, written=written)
        committed = _all_visible(env, written, timeout=60)
        writer = background_writes(env, written, 3000, pause=0.02)
        wait_until(lambda: uncommitted_messages(env.servers.kafka_bootstrap, env.topic()) > 200, 60,
                   "an open transaction of several reads with over 200 messages in the log", interval=0.05)
        a.kill()
        at_kill = read_topic(env.servers.kafka_bootstrap, env.topic())
        checkpoint = (lease_doc(env.db, env.settings) or {}).get("resumeToken")
        b.start()
        _leader(env, "B")
        writer.join()
        records = _all_visible(env, written)
    finally:
        a.stop()
        b.stop()
    assert [r.id for r in at_kill] == [r.id for r in committed], "nothing of the open transaction was visible"
    opened = [line for line in b.log().splitlines() if "change stream opened" in line]
    assert opened, b.log()[-3000:]
    _exactly_once(records, written)
    aborted = _aborted_copies(env, records)
    print(f"\nkilled inside a transaction spanning several reads: {len(committed)} committed before, {aborted} "
          f"aborted copies (read_uncommitted), {len(records)} events visible once; checkpoint at the kill "
          f"{str(checkpoint)[:40]}; B: {opened[0][-120:]}")
    assert aborted > 200, "the open transaction's messages were in the log, and aborted"


def test_zombie_leader_is_fenced_by_the_broker_and_nothing_it_sends_after_the_takeover_is_visible(env, tmp_path):
    """A is paused (SIGSTOP) inside a transaction past its lease; B takes the lease, fences A's
    producer (init_transactions aborts A's transaction) and commits; A resumes: its commit fails
    fenced, it goes back to standby, and none of its messages after B's first is visible."""
    batch = 100  # reads and transactions of at most 100 events: A's open transaction holds at most that many
    settings = eos(env, batch_max_events=batch, transaction_max_events=batch)
    a = RelayProcess(settings.replace(instance_id="A"), tmp_path, "A", module=SLOW_COMMIT,
                     extra_env={"RELAY_TEST_COMMIT_DELAY_S": "1.0"}).start()
    b = RelayProcess(settings.replace(instance_id="B"), tmp_path, "B")
    written = Written()
    try:
        a_token = _leader(env, "A")["fencingToken"]
        b.start()
        writer = background_writes(env, written, 3000)
        wait_until(lambda: len(written.ids) > 500, 60, "writes under way")
        _pause_inside_a_transaction(env, a)
        b_token = _leader(env, "B", timeout=60)["fencingToken"]
        wait_until(lambda: any(r.fencing == b_token for r in read_topic(env.servers.kafka_bootstrap, env.topic())),
                   60, "B's first commit")
        a.resume()
        wait_until(lambda: "back to standby" in a.log() or not a.alive, 60, "A to learn it lost the lease")
        writer.join()
        records = _all_visible(env, written)
        appended = topic_size(env.servers.kafka_bootstrap, env.topic())
        assert a.alive, f"A goes back to standby, it does not crash (exit {a.returncode}):\n{a.log()[-4000:]}"
    finally:
        a.stop()
        b.stop()
    how = "ProducerFencedError" if "ProducerFencedError" in a.log() else "LeaseLostError"
    assert how in a.log(), a.log()[-3000:]
    assert b_token > a_token
    _exactly_once(records, written)
    late = written_after_first_of(records, b_token)
    assert late == [], f"{len(late)} of A's messages after B's first are visible to read_committed"
    visible = {(r.partition, r.offset) for r in records}
    uncommitted = read_topic(env.servers.kafka_bootstrap, env.topic(), isolation="read_uncommitted")
    a_aborted = [r for r in uncommitted if r.fencing == a_token and (r.partition, r.offset) not in visible]
    assert 0 < len(a_aborted) <= batch, "A's open transaction was aborted; A sent nothing after it"
    print(f"\nzombie in exactly-once mode: fencing A={a_token} B={b_token}; A learned it by {how}; A's messages "
          f"visible after B's first: 0; A's aborted copies (read_uncommitted): {len(a_aborted)}; "
          f"{len(records)} visible of {appended} offsets appended")


@pytest.mark.parametrize("in_the_log", [True, False], ids=["messages-in-the-log", "messages-queued"])
def test_broker_killed_and_restarted_mid_transaction_loses_and_duplicates_nothing(env, tmp_path, in_the_log):
    """The broker is SIGKILLed while a transaction is open, and started again.

    messages-in-the-log: the transaction's messages were appended (uncommitted); with a 30 s
    delivery timeout the transaction outlives the outage and commits once the broker is back.
    messages-queued: they are still in the producer's queue (linger 2 s); with a 4 s delivery
    timeout they time out during the outage, the transaction is aborted (or, the broker being
    down, left to the next producer of the lease to abort), the relay restarts, and the next
    producer resumes after the offsets topic's record."""
    broker = needs_local_stack(env.servers).kafka
    if in_the_log:
        kafka, extra = {"message.timeout.ms": "30000"}, {}
    else:
        kafka = {"message.timeout.ms": "4000", "linger.ms": "2000"}
        extra = {"RELAY_TEST_COMMIT_FLUSH": "0", "RELAY_TEST_COMMIT_DELAY_S": "1.0"}
    relay = RelayProcess(eos(env, instance_id="R", kafka=kafka), tmp_path, "R", module=SLOW_COMMIT,
                         extra_env=extra).start()
    written = Written()
    try:
        _leader(env, "R")
        writer = background_writes(env, written, 4000)
        wait_until(lambda: len(written.ids) > 1000, 60, "writes under way")
        if in_the_log:
            _inside_a_transaction(env)
        else:
            opened = relay.log().count(MARKER)
            wait_until(lambda: relay.log().count(MARKER) > opened, 30, "a transaction with its messages queued",
                       interval=0.05)
        broker.process.kill()
        time.sleep(3)
        broker.start()
        writer.join()
        records = _all_visible(env, written)
        assert relay.alive, relay.log()[-3000:]
    finally:
        relay.stop()
    _exactly_once(records, written)
    restarts = [line for line in relay.log().splitlines() if "restarting from the checkpoint" in line]
    print(f"\nbroker SIGKILL + restart inside a transaction, {'messages in the log' if in_the_log else 'queued'}: "
          f"{len(written.ids)} events, 0 duplicates visible to read_committed, {_aborted_copies(env, records)} aborted "
          f"copies visible to read_uncommitted, {len(restarts)} restarts")
    if not in_the_log:
        assert restarts, "the queued messages timed out during the outage: the transaction failed, the relay restarted"

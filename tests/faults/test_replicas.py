"""Several relay replicas on one outbox (docs/faults.md rows 2, 12, 15): lease, fencing, handover."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time

from relay.outbox import Outbox, OutboxEvent
from tests.support.leases import CheckpointWatcher, lease_doc
from tests.support.oracle import all_published, assert_complete_and_ordered, written_after_first_of
from tests.support.paths import ROOT
from tests.support.relays import RelayProcess, settings_env
from tests.support.topics import topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes


def _owner(env) -> str | None:
    doc = lease_doc(env.db, env.settings)
    return doc.get("owner") if doc else None


def _roles(env) -> dict[str, str]:
    """Each replica's role as `outbox-relay status` reports it."""
    status = subprocess.run([sys.executable, "-m", "relay", "status"], env=settings_env(env.settings),
                            capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    return {r["instance"]: r["role"] for r in json.loads(status.stdout)["replicas"]}


def _leader(env, instance: str, timeout: float = 60) -> dict:
    return wait_until(lambda: (d := lease_doc(env.db, env.settings)) and d.get("owner") == instance and d,
                      timeout, f"{instance} to hold the lease")


def test_zombie_replica_cannot_move_the_checkpoint_and_stops_within_one_batch(env, tmp_path):
    """Replica A is paused past its lease; B takes over; A resumes (docs/faults.md row 12)."""
    batch = 100
    settings = env.settings.replace(batch_max_events=batch)
    # A lingers 1.5 s before sending, so a pause most likely catches it with messages queued:
    # on SIGCONT those go out late, with A's old fencing token.
    a = RelayProcess(settings.replace(instance_id="A"), tmp_path, "A",
                     extra_env={"RELAY_KAFKA_LINGER_MS": "1500"}).start()
    b = RelayProcess(settings.replace(instance_id="B"), tmp_path, "B")
    written = Written()
    try:
        with CheckpointWatcher(env.db, settings) as watcher:
            a_token = _leader(env, "A")["fencingToken"]
            b.start()
            writer = background_writes(env, written, 3000)
            wait_until(lambda: len(written.ids) > 500, 60, "writes under way")
            a.pause()
            b_token = _leader(env, "B", timeout=60)["fencingToken"]
            wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) > len(written.ids) // 2,
                       60, "B publishing")
            a.resume()
            writer.join()
            records = all_published(env, written)
            wait_until(lambda: "back to standby" in a.log() or not a.alive, 60, "A to learn it lost the lease")
        assert a.alive, "A goes back to standby, it does not crash"
    finally:
        a.stop()
        b.stop()
    assert b_token > a_token
    watcher.assert_never_went_backwards()
    verdict = assert_complete_and_ordered(records, written)
    # A's messages written after B's first message, per partition: the zombie's late batch.
    late = written_after_first_of(records, b_token)
    assert all(r.fencing == a_token for r in late), "late messages carry the zombie's old fencing token"
    assert len(late) <= batch, f"A published {len(late)} messages after losing the lease (> one batch)"
    print(f"\nzombie: fencing A={a_token} B={b_token}; A's late messages: {len(late)}; "
          f"duplicates: {len(verdict.duplicates)}")


def test_sigterm_hands_over_at_once_and_sigkill_after_the_lease_expires(env, tmp_path):
    """Graceful stop stores the final checkpoint and releases the lease (docs/faults.md row 15)."""
    written = Written()
    a = RelayProcess(env.settings.replace(instance_id="A"), tmp_path, "A").start()
    b = RelayProcess(env.settings.replace(instance_id="B"), tmp_path, "B")
    c = None
    try:
        _leader(env, "A")
        b.start()
        writer = background_writes(env, written, 3000)
        wait_until(lambda: len(written.ids) > 1000, 60, "writes under way")
        with CheckpointWatcher(env.db, env.settings) as lease:
            wait_until(lambda: "A" in lease.last, 30, "the watcher to see A's lease")
            sent = time.monotonic()
            assert a.terminate() == 0, a.log()
            stopped = time.monotonic()
            b_first = wait_until(lambda: lease.first.get("B"), 60, "B to hold the lease")
            graceful = time.monotonic() - sent
        assert lease_doc(env.db, env.settings).get("releasedAt") is not None, "A released the lease on SIGTERM"
        # Server clock: A's last renewal plus the TTL is when its lease would have expired; B's
        # renewedAt when first seen holding it is no earlier than B's takeover.
        a_expiry = lease.last["A"]["renewedAt"] + dt.timedelta(seconds=env.settings.lease_ttl_s)
        assert b_first["renewedAt"] < a_expiry, "a graceful stop does not wait for the lease to expire"
        c = RelayProcess(env.settings.replace(instance_id="C"), tmp_path, "C").start()
        wait_until(lambda: {"B": "leader", "C": "standby"}.items() <= _roles(env).items(), 60,
                   "status to show B leading and C in standby")
        killed = time.monotonic()
        b.kill()
        _leader(env, "C", timeout=60)
        hard = time.monotonic() - killed
        writer.join()
        records = all_published(env, written)
    finally:
        for proc in (a, b, c):
            if proc is not None:
                proc.stop()
    verdict = assert_complete_and_ordered(records, written)
    print(f"\nhandover, SIGTERM to B leading: {graceful:.2f} s (A took {stopped - sent:.2f} s to stop); "
          f"after SIGKILL: {hard:.2f} s (lease TTL {env.settings.lease_ttl_s:g} s); "
          f"duplicates {len(verdict.duplicates)}")


def test_relay_killed_inside_a_large_transaction_publishes_all_of_it_in_order(env, tmp_path):
    """N events of one transaction; the relay is killed while publishing them (docs/faults.md row 2)."""
    n = 3000
    settings = env.settings.replace(batch_max_events=10)
    events = [OutboxEvent.new("order", f"tx-{i % 7}", "Line", {"seq": i}) for i in range(n)]
    with env.client.start_session() as session, session.start_transaction():
        Outbox(env.outbox).add_many(events, session=session)
    written = Written()
    written.add(events)
    # The first run hands Kafka 10 events at a time and waits for each acknowledgement (300 round
    # trips: about a second on an idle machine), and it is killed at its first published events.
    # (A long linger.ms no longer slows it: the relay flushes once it waits for every report.)
    first = RelayProcess(settings.replace(instance_id="first"), tmp_path, "first").start()
    try:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 10, 60, "part of the transaction",
                   interval=0.01)
        first.kill()
        part = topic_size(env.servers.kafka_bootstrap, env.topic())
        second = RelayProcess(settings.replace(instance_id="second"), tmp_path, "second").start()
        records = all_published(env, written)
        second.stop()
    finally:
        first.stop()
    assert part < n, "the kill landed inside the transaction's events"
    verdict = assert_complete_and_ordered(records, written)
    print(f"\ntransaction of {n}: killed after {part} published; duplicates {len(verdict.duplicates)}")

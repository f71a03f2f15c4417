"""Faults on NATS JetStream (docs/faults.md rows 1, 10, 12, 20; docs/nats.md): relay kills during a
backlog, nats-server SIGKILLed and restarted on its store, a leader paused past its lease, wrong
credentials. The oracle reads the whole stream: every committed event is there, first copies per
aggregate in commit order, and, the stream dropping what it stored within its duplicate window
(Nats-Msg-Id), each event once."""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from relay.dev.nats_server import NatsServer
from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayProcess, RelayThread
from tests.support.soak import size
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events


def _all_in_stream(nenv, written: Written, timeout: float = 180):
    return wait_until(lambda: (r := nenv.read()) and {x.id for x in r} >= written.ids and r, timeout,
                      "every event in the stream", interval=1)


def _writer(nenv, written: Written, total: int, until: threading.Event, pause: float) -> threading.Thread:
    thread = threading.Thread(target=write_events, kwargs=dict(
        db=nenv.db, collection=nenv.settings.outbox_collection, total=total, writers=4, max_per_txn=5,
        written=written, pause=lambda: time.sleep(pause), until=until), daemon=True)
    thread.start()
    return thread


@pytest.mark.soak
@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_relay_killed_five_times_during_a_backlog_every_event_once_in_order(nenv, tmp_path, delivery):
    """Five SIGKILLs of the relay at random points while four writers commit: nothing lost, first
    copies in commit order per aggregate, and no event twice in the stream (each republish lies
    within the duplicate window). The suite writes at least 3,000 events (the soak 20,000)."""
    total, kills = size(3_000, 20_000), 5
    rng = random.Random(51)
    written, done = Written(), threading.Event()
    writer = _writer(nenv, written, total, done, size(0.07, 0.01))
    settings = nenv.settings.replace(delivery=delivery)
    runs: list[RelayProcess] = []
    try:
        for i in range(kills):
            proc = RelayProcess(settings.replace(instance_id=f"run-{i}"), tmp_path, f"run-{i}").start()
            runs.append(proc)
            wait_until(lambda i=i: (lease_doc(nenv.db, nenv.settings) or {}).get("owner") == f"run-{i}", 60,
                       f"run {i} to take the lease")
            # Killed while it publishes what no run before it stored: on a loaded machine a run
            # can spend seconds starting and republishing copies the stream drops.
            stored = nenv.size()
            wait_until(lambda: nenv.size() > stored, 120, f"run {i} adding to the stream")
            time.sleep(rng.uniform(0.3, 2.5))
            proc.kill()
        final = RelayProcess(settings.replace(instance_id="final"), tmp_path, "final").start()
        runs.append(final)
        wait_until(lambda: (lease_doc(nenv.db, nenv.settings) or {}).get("owner") == "final", 60, "the final run")
        done.set()
        writer.join()
        records = _all_in_stream(nenv, written)
        assert final.terminate() == 0, final.log()
    finally:
        done.set()
        writer.join()
        for proc in runs:
            proc.stop()
    verdict = assert_complete_and_ordered(records, written)
    fencing = sorted({r.fencing for r in records})
    print(f"\n{len(written.ids)} events, {kills} kills, {len(verdict.duplicates)} duplicates, runs {fencing}")
    assert not verdict.duplicates, f"{len(verdict.duplicates)} events twice in the stream"
    assert len(fencing) >= 3, "the kills should have hit runs that were publishing"


@pytest.fixture
def own_server():
    """A nats-server of the test's own, to kill and restart."""
    server = NatsServer(Path(tempfile.mkdtemp(prefix="outbox-relay-nats-own-")))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.base_dir, ignore_errors=True)


@pytest.mark.soak
def test_nats_server_killed_and_restarted_on_its_store_loses_nothing_and_keeps_the_order(nenv, own_server):
    """nats-server SIGKILLed twice during a backlog and started again on the same store (port,
    JetStream folder): the relay fails its session, waits, publishes again from its stored checkpoint;
    nothing lost, first copies in commit order, no event twice (the window is rebuilt from the
    store). The suite writes at least 2,000 events (the soak 10,000)."""
    nenv.server = own_server
    settings = nenv.settings.replace(nats_servers=own_server.url)
    written, done = Written(), threading.Event()
    writer = _writer(nenv, written, size(2_000, 10_000), done, size(0.05, 0.01))
    try:
        with RelayThread(settings) as relay:
            for _ in range(2):
                wait_until(lambda: nenv.size() > len(written.ids) // 3, 60, "publishing under way")
                own_server.kill()
                time.sleep(1.0)
                own_server.start()
            done.set()
            writer.join()
            records = _all_in_stream(nenv, written)
        assert relay.error is None, relay.error
    finally:
        done.set()
        writer.join()
    verdict = assert_complete_and_ordered(records, written)
    print(f"\n{len(written.ids)} events, 2 server kills, {len(verdict.duplicates)} duplicates")
    assert not verdict.duplicates
    assert relay.metric_labels("relay_restarts_total", "kind"), "the kills made the relay restart"


def test_a_leader_paused_past_its_lease_publishes_nothing_late_and_nothing_twice(nenv, tmp_path):
    """A (a child process) is paused past its lease while writers commit; B takes over and
    publishes; A resumes. A's parcels were handed over with a `publish_by` its pause outlived: it
    puts none of them on the wire (and what it had there the stream drops as duplicates). Nothing
    lost, every event once, first copies in commit order."""
    settings = nenv.settings.replace(batch_max_events=100)
    a = RelayProcess(settings.replace(instance_id="A"), tmp_path, "A").start()
    b = RelayProcess(settings.replace(instance_id="B"), tmp_path, "B")
    written = Written()
    done = threading.Event()
    try:
        wait_until(lambda: (lease_doc(nenv.db, nenv.settings) or {}).get("owner") == "A", 60, "A to lead")
        b.start()
        writer = _writer(nenv, written, 3000, done, 0.02)
        wait_until(lambda: len(written.ids) > 500, 60, "writes under way")
        a.pause()
        wait_until(lambda: (lease_doc(nenv.db, nenv.settings) or {}).get("owner") == "B", 60, "B to take over")
        wait_until(lambda: nenv.size() > len(written.ids) // 2, 60, "B publishing")
        a.resume()
        done.set()
        writer.join()
        records = _all_in_stream(nenv, written)
        wait_until(lambda: "standby" in a.log() or not a.alive, 60, "A to learn it lost the lease")
        assert a.alive, "A goes back to standby"
    finally:
        done.set()
        a.stop()
        b.stop()
    verdict = assert_complete_and_ordered(records, written)
    a_token, b_token = 1, max(r.fencing for r in records)
    first_b = next(r.offset for r in records if r.fencing == b_token)
    late = [r for r in records if r.offset > first_b and r.fencing == a_token]
    print(f"\npaused leader: A's messages after B's first: {len(late)}; duplicates {len(verdict.duplicates)}")
    assert not late, f"A put {len(late)} messages in the stream after B started"
    assert not verdict.duplicates


def test_wrong_credentials_stop_at_start_with_one_line_naming_the_setting_and_no_secret(nenv, tmp_path):
    server = NatsServer(Path(tempfile.mkdtemp(prefix="outbox-relay-nats-auth-")),
                        extra_args=["--user", "relay", "--pass", "right-password-123"])
    server.start()
    try:
        settings = nenv.settings.replace(nats_servers=server.url, nats_user="relay", nats_password="wrong-password-456")
        proc = RelayProcess(settings, tmp_path, "wrong").start()
        wait_until(lambda: not proc.alive, 60, "the relay to stop")
        log = proc.log()
    finally:
        server.stop()
        shutil.rmtree(server.base_dir, ignore_errors=True)
    assert proc.returncode == 2, log
    errors = [line for line in log.splitlines() if '"level": "ERROR"' in line]
    assert len(errors) == 1, log
    assert "RELAY_NATS_PASSWORD" in errors[0] and "Authorization Violation" in errors[0]
    assert "wrong-password-456" not in log and "right-password-123" not in log
    assert "Traceback" not in log


def test_a_nats_server_whose_port_is_taken_starts_on_another(tmp_path):
    """Issue 50: a port held by another process when the server starts: it starts on another."""
    import socket

    from relay.dev.ports import Ports

    squatter = Ports()
    [port] = squatter.take([0], "the test")
    squatter.release()  # free for the server to pick, then taken by a plain listener
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    server = NatsServer(tmp_path / "nats", port=port)
    try:
        server.start()
        assert server.port != port and server.process is not None and server.process.alive
    finally:
        server.stop()
        listener.close()

"""MongoDB-side faults (docs/faults.md rows 4, 5, 13, 14), injected with failCommand or SIGSTOP."""

from __future__ import annotations

import time

import pytest

from relay.core.errors import RepeatedStreamError
from tests.support.leases import CheckpointWatcher, lease_doc
from tests.support.mongodb import failpoint
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.servers import needs_local_stack
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import write_events


def _restarts(relay) -> float:
    return sum(relay.metric("relay_restarts_total", kind=kind)
               for kind in relay.metric_labels("relay_restarts_total", "kind"))


def _published(env, n: int, timeout: float = 90) -> None:
    wait_until(lambda: len({r.id for r in read_topic(env.servers.kafka_bootstrap, env.topic())}) >= n,
               timeout, f"{n} distinct events in the topic", interval=1)


@pytest.mark.parametrize("fault", [
    {"errorCode": 6, "errorLabels": ["ResumableChangeStreamError"]},
    {"closeConnection": True},
], ids=["resumable-label", "close-connection"])
def test_resumable_getmore_errors_are_invisible_except_in_metrics(env, fault):
    with RelayThread(env.settings) as relay:
        written = write_events(env.db, env.settings.outbox_collection, total=300, writers=2)
        _published(env, 300)
        for _ in range(3):
            with failpoint(env.client, {"times": 1}, failCommands=["getMore"], **fault):
                more = write_events(env.db, env.settings.outbox_collection, total=100, writers=1,
                                    seed=len(written.ids), written=written)
                _published(env, len(more.ids))
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)
    assert not verdict.duplicates, "a driver-level resume continues after the last change: no replay"
    assert relay.metric("relay_stream_resumes_total") >= 1, "the resumes show in relay_stream_resumes_total"
    assert _restarts(relay) == 0, "no relay restart"


@pytest.mark.parametrize("code", [280, 136], ids=["ChangeStreamFatalError", "CappedPositionLost"])
def test_non_resumable_getmore_error_reopens_from_the_checkpoint(env, code):
    with RelayThread(env.settings) as relay:
        written = write_events(env.db, env.settings.outbox_collection, total=200, writers=2)
        _published(env, 200)
        with failpoint(env.client, {"times": 1}, failCommands=["getMore"], errorCode=code):
            write_events(env.db, env.settings.outbox_collection, total=200, writers=2, seed=9, written=written)
            _published(env, 400)
    assert relay.error is None, relay.error
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)
    assert "ReopenableStreamError" in relay.metric_labels("relay_restarts_total", "kind")


def test_non_resumable_getmore_error_that_repeats_stops_the_relay_with_the_code(env):
    write_events(env.db, env.settings.outbox_collection, total=50, writers=1)
    with failpoint(env.client, "alwaysOn", failCommands=["getMore"], errorCode=280):
        with RelayThread(env.settings) as relay:
            relay.thread.join(timeout=60)
    assert isinstance(relay.error, RepeatedStreamError)
    assert "280" in str(relay.error) and "ChangeStreamFatalError" in str(relay.error)


@pytest.mark.parametrize("fault, write_applied", [
    # failCommand applies the write, then reports the write concern error: stored, not acknowledged.
    ({"writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"}}, True),
    ({"closeConnection": True}, False),
], ids=["write-concern-error", "close-connection"])
def test_failing_checkpoint_write_advances_nothing_until_acknowledged(env, fault, write_applied):
    """Every update fails (the checkpoint stores, the lease renewals): events are still published by
    each session, and the stored checkpoint does not move until an update is acknowledged again.

    A session publishes only if its first read comes before its first renewal is due (one heartbeat
    interval after taking the lease, which is a findAndModify and succeeds). With closeConnection
    each failure clears pymongo's pool and marks the primary unknown until its monitor checks it
    again, so on this machine a session's first read often came after the suite's 1 s interval and
    no session ever published: hence 3 s here (and a lease that outlives it)."""
    settings = env.settings.replace(heartbeat_interval_s=3.0, lease_ttl_s=10.0)
    with RelayThread(settings) as relay:
        [observer] = relay.relay.observer.loops.values()  # the loop of the one outbox
        written = write_events(env.db, env.settings.outbox_collection, total=200, writers=2)
        _published(env, 200)
        wait_until(lambda: (lease_doc(env.db, env.settings) or {}).get("resumeToken"), 30, "a checkpoint")
        # A lower bound for the replay check below: later idle passes only move the checkpoint on.
        stored = lease_doc(env.db, env.settings)["resumeToken"]
        with failpoint(env.client, "alwaysOn", failCommands=["update"], **fault):
            # The idle pass writes the lease every 3 s (above). Snapshot only once a write has
            # failed: the loop is single-threaded, so after that restart nothing can still land.
            wait_until(lambda: _restarts(relay) >= 1, 30, "a refused checkpoint or lease write")
            acknowledged = observer.checkpoint
            frozen = lease_doc(env.db, env.settings)["resumeToken"]
            write_events(env.db, env.settings.outbox_collection, total=200, writers=2, seed=5, written=written)
            _published(env, 400)  # published, but the checkpoint write is never acknowledged
            # Two more refused writes after every event was published: the relay tried to store
            # a checkpoint covering them, twice, and each attempt failed.
            after = _restarts(relay)
            wait_until(lambda: _restarts(relay) >= after + 2, 60, "two more refused writes")
            assert observer.checkpoint == acknowledged, "the relay moved on without an acknowledged checkpoint"
            if not write_applied:
                assert lease_doc(env.db, env.settings)["resumeToken"] == frozen
        wait_until(lambda: observer.checkpoint != acknowledged, 60,
                   "the checkpoint to advance once writes are acknowledged again")
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)
    for dup in verdict.duplicates:
        assert dup.position > stored["_data"], "replayed only after the last stored checkpoint"


def test_mongodb_paused_makes_the_relay_unready_then_it_recovers_without_loss(env):
    stack = needs_local_stack(env.servers)
    mongod = stack.mongo.processes[0]
    with RelayThread(env.settings) as relay, CheckpointWatcher(env.db, env.settings) as watcher:
        written = write_events(env.db, env.settings.outbox_collection, total=300, writers=2)
        _published(env, 300)
        wait_until(relay.relay.observer.ready, 30, "the relay to be ready")
        mongod.pause()
        try:
            wait_until(lambda: not relay.relay.observer.ready(), 30, "readiness to report MongoDB unreachable")
        finally:
            mongod.resume()
        write_events(env.db, env.settings.outbox_collection, total=300, writers=2, seed=3, written=written)
        _published(env, 600)
        wait_until(relay.relay.observer.ready, 60, "the relay to be ready again")
    assert relay.error is None, relay.error
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)
    watcher.assert_never_went_backwards()


def test_renewals_failing_for_less_than_the_lease_leave_the_session_publishing(env, logs):
    """Issue 50: every lease write fails (renewals and positions: `update`) for a few seconds, less
    than the lease lasts: the session is kept, events written meanwhile are published, nothing
    restarts; once writes succeed again the checkpoint moves on."""
    settings = env.settings.replace(heartbeat_interval_s=2.0, lease_ttl_s=14.0)  # provably valid 12 s
    captured = logs("json")
    with RelayThread(settings) as relay:
        written = write_events(env.db, env.settings.outbox_collection, total=100, writers=2)
        _published(env, 100)
        with failpoint(env.client, "alwaysOn", failCommands=["update"], closeConnection=True):
            wait_until(lambda: "could not write the lease" in captured.text, 30, "a refused lease write")
            write_events(env.db, env.settings.outbox_collection, total=100, writers=2, seed=5, written=written)
            _published(env, 200)  # published while every lease write fails
            assert _restarts(relay) == 0, "the session survived the refused writes"
        stored = lease_doc(env.db, env.settings)["resumeToken"]
        wait_until(lambda: lease_doc(env.db, env.settings)["resumeToken"] != stored, 30,
                   "the checkpoint to be stored again")
    assert relay.error is None, relay.error
    assert _restarts(relay) == 0
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)


def test_renewals_failing_for_longer_stop_publishing_before_the_lease_expires(env, logs):
    """Every lease write fails (taking it again too: findAndModify) for longer than the lease: the
    session stops publishing before the lease's expiry by the server's clock, says so in one line,
    and nothing written after that is published until writes succeed again; then nothing is lost."""
    settings = env.settings.replace(heartbeat_interval_s=2.0, lease_ttl_s=8.0)
    captured = logs("json")
    with RelayThread(settings) as relay:
        written = write_events(env.db, env.settings.outbox_collection, total=100, writers=2)
        _published(env, 100)
        with failpoint(env.client, "alwaysOn", failCommands=["update", "findAndModify"], closeConnection=True):
            wait_until(lambda: "stopped publishing" in captured.text, 60, "the session to stop publishing")
            stop = next(line for line in captured.lines() if "stopped publishing" in line.get("message", ""))
            # The line is logged once the session is torn down (its last checkpoint tried, and
            # refused by the failpoint): under load after the expiry. What it says was decided
            # when publishing stopped: before the lease could expire.
            assert "s before it can expire" in stop["message"], stop["message"]
            published = len(read_topic(env.servers.kafka_bootstrap, env.topic()))
            more = write_events(env.db, env.settings.outbox_collection, total=50, writers=1, seed=7)
            written.add_from(more)
            time.sleep(3)
            assert not {r.id for r in read_topic(env.servers.kafka_bootstrap, env.topic())} & more.ids, \
                "nothing published without a lease"
            assert len(read_topic(env.servers.kafka_bootstrap, env.topic())) == published
        _published(env, 150)
    assert relay.error is None, relay.error
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)

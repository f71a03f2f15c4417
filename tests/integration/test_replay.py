"""`outbox-relay replay` against real servers (docs/replay.md): the same messages as the live relay,
marked with `relay_replay`, in commit order per aggregate; beside a running relay without touching
its lease or position; the collection before the oplog's window; filters, --to-topic, --dry-run;
an interrupted replay resumed or run again; bad input as one line and its exit code."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from bson import ObjectId
from pymongo import MongoClient

from relay.cli import main
from relay.core.message import HEADER_REPLAY
from relay.dev.processes import spawn
from relay.kafka.acls import required
from relay.outbox import Outbox, OutboxEvent
from tests.inbox_support import (
    EFFECTS,
    INBOX,
    InboxThread,
    assert_effects_exactly_once_in_order,
    effects_handler,
    wait_applied,
)
from tests.security_servers import SaslKafka, sasl_kafka
from tests.support.leases import CheckpointWatcher, lease_doc
from tests.support.mongodb import failpoint
from tests.support.oracle import all_published, assert_complete_and_ordered
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.servers import replica_set
from tests.support.topics import read_messages, read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes, write_events


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@pytest.fixture
def replay(env, monkeypatch, capsys, tmp_path):
    """Run `outbox-relay replay ARGS` in this process with the test's settings: (exit code, the
    JSON lines it printed: start line first, summary line last)."""
    for key, value in settings_env(env.settings).items():
        if key.startswith("RELAY_"):
            monkeypatch.setenv(key, value)

    err: list[str] = []

    def run(*args: str) -> tuple[int, list[dict]]:
        capsys.readouterr()
        code = main(["replay", "--state-dir", str(tmp_path / "replays"), *args])
        captured = capsys.readouterr()
        err[:] = [line for line in captured.err.splitlines() if line.strip()]
        return code, [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]

    run.stderr = err  # the last run's stderr lines (its log and its stop line)
    return run


def _cli(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", "replay", *args], capture_output=True, text=True,
                          env=settings_env(env.settings), cwd=ROOT, timeout=timeout)


def _marked(messages, replay_id: str | None):
    """The messages carrying `relay_replay` = `replay_id` (None: those without the header)."""
    def mark(m):
        return dict(m.headers() or []).get(HEADER_REPLAY)
    return [m for m in messages if (mark(m) is None if replay_id is None else mark(m) == replay_id.encode())]


def _publish(env, total: int, **kw) -> Written:
    written = write_events(env.db, env.settings.outbox_collection, total, writers=3, **kw)
    with RelayThread(env.settings):
        all_published(env, written)
    return written


def test_a_consumer_that_lost_its_state_gets_exactly_its_effects_back_in_order(env, replay):
    """The inbox applied 300 events; its database is restored from an empty backup (effects and
    inbox records gone); a replay of the range makes the effects exactly right again, in order;
    each replayed message is the live one (key, value bytes, headers) plus `relay_replay`."""
    since = _now() - dt.timedelta(milliseconds=5)
    written = _publish(env, 300)
    run = dict(topics=[env.topic()], group_id="billing", bootstrap_servers=env.servers.kafka_bootstrap)
    with InboxThread(env.db, effects_handler(env.db), **run) as inbox:
        wait_applied(env.db, 300, alive=inbox.check_alive)
    assert_effects_exactly_once_in_order(env.db, written)
    env.db[EFFECTS].drop()
    env.db[INBOX].drop()

    with env.client.watch(max_await_time_ms=500) as changes:  # every write to the cluster from here on
        code, lines = replay("--since", _iso(since))
        env.outbox.insert_one({"_id": "after the replay"})  # a mark: what precedes it is the replay's
        during = []
        while (change := changes.try_next()) is None or change.get("documentKey") != {"_id": "after the replay"}:
            if change is not None:
                during.append(change)
    assert during == [], f"the replay wrote to MongoDB: {during[:3]}"  # no lease, no position, nothing
    env.outbox.delete_one({"_id": "after the replay"})
    assert code == 0, lines
    start, summary = lines[0], lines[-1]
    assert [p["from"] for p in start["parts"][str(env.namespace)]] == ["oplog"]
    assert summary["events"] == 300
    assert summary["summary"] == {str(env.namespace): {env.topic(): {"oplog": 300, "collection": 0}}}

    with InboxThread(env.db, effects_handler(env.db), **run) as inbox:
        wait_applied(env.db, 300, alive=inbox.check_alive)
        time.sleep(1)  # nothing more arrives
    assert_effects_exactly_once_in_order(env.db, written)

    messages = read_messages(env.servers.kafka_bootstrap, env.topic())
    live, replayed = _marked(messages, None), _marked(messages, start["replay"])
    assert len(live) == 300 and len(replayed) == 300
    original = {dict(m.headers())["ce_id"]: m for m in live}
    for m in replayed:
        o = original[dict(m.headers())["ce_id"]]
        assert (m.key(), m.value(), m.partition()) == (o.key(), o.value(), o.partition())
        assert m.headers() == [*o.headers(), (HEADER_REPLAY, start["replay"].encode())]


def test_a_replay_beside_the_live_relay_under_load_leaves_the_live_stream_and_position_alone(env, replay):
    written, later = Written(), Written()
    since = _now() - dt.timedelta(milliseconds=5)
    with RelayThread(env.settings) as relay, CheckpointWatcher(env.db, env.settings) as watcher:
        write_events(env.db, env.settings.outbox_collection, 400, writers=2, written=written)
        all_published(env, written)
        until = _now()
        fencing = lease_doc(env.db, env.settings)["fencingToken"]
        writer = background_writes(env, later, 600, writers=2, pause=0.005)
        code, lines = replay("--since", _iso(since), "--until", _iso(until))
        writer.join()
        relay.check_alive()
        written.add_from(later)
        all_published(env, written)
        assert lease_doc(env.db, env.settings)["fencingToken"] == fencing  # no lease taken
    watcher.assert_never_went_backwards()
    assert code == 0 and lines[-1]["events"] == 400, lines

    records = read_topic(env.servers.kafka_bootstrap, env.topic())
    live = [r for r in records if HEADER_REPLAY not in r.headers]
    replayed = [r for r in records if HEADER_REPLAY in r.headers]
    verdict = assert_complete_and_ordered(live, written)
    assert not verdict.duplicates, f"{len(verdict.duplicates)} duplicates in the live stream"
    assert {r.headers[HEADER_REPLAY] for r in replayed} == {lines[0]["replay"]}
    first_batch = Written()
    first_batch.per_aggregate.update({a: [i for i in ids if i not in later.ids] for a, ids in written.per_aggregate.items()})
    first_batch.ids = written.ids - later.ids
    replay_verdict = assert_complete_and_ordered(replayed, first_batch)
    assert not replay_verdict.duplicates
    assert all(r.fencing == fencing for r in replayed)  # the lease's token, read


def _insert(env, events: list[OutboxEvent]) -> None:
    Outbox(env.outbox).add_many(events)


def _oplog_start(env) -> dt.datetime:
    first = env.client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
    return first["ts"].as_datetime()


def test_a_range_older_than_the_oplog_is_read_from_the_collection_then_from_the_oplog(env, replay):
    """Documents that occurred before the oplog's oldest entry come from the collection, in
    (occurredAt, _id) order; those after it from the oplog; none from both."""
    oplog_start = _oplog_start(env)
    old_start = oplog_start - dt.timedelta(hours=1)
    old = [OutboxEvent.new("order", f"a{i % 3}", "Changed", {"seq": i // 3 + 1}, occurred_at=old_start + dt.timedelta(seconds=i))
           for i in range(30)]
    _insert(env, old[::-1][:15][::-1] + old[:15])  # inserted out of order: the collection orders them
    new = [OutboxEvent.new("order", f"a{i % 3}", "Changed", {"seq": 11 + i // 3}) for i in range(12)]
    _insert(env, new)

    code, lines = replay("--since", _iso(old_start))
    assert code == 0, lines
    assert [p["from"] for p in lines[0]["parts"][str(env.namespace)]] == ["collection", "oplog"]
    assert lines[-1]["summary"][str(env.namespace)][env.topic()] == {"collection": 30, "oplog": 12}
    records = read_topic(env.servers.kafka_bootstrap, env.topic())
    assert [r.id for r in records if r.key == "a0"] == [e.id_str for e in [*old, *new] if e.aggregate_id == "a0"]
    assert len(records) == 42 and len({r.id for r in records}) == 42


def test_filters_by_aggregate_and_type_to_another_topic_and_a_dry_run(env, replay):
    since = _now() - dt.timedelta(milliseconds=5)
    _insert(env, [OutboxEvent.new(kind, f"{kind}-{i % 4}", "Changed", {"seq": i}) for kind in ("order", "customer")
                  for i in range(20)])
    env.outbox.insert_one({"_id": "poison", "aggregateType": "order", "aggregateId": "order-0"})  # no eventType
    target = f"{env.topic()}.replayed"

    code, lines = replay("--since", _iso(since), "--dry-run")
    assert code == 0 and lines[-1]["dryRun"] is True
    assert lines[-1]["skippedPoison"] == {str(env.namespace): 1}  # left out, on the loop's encode path
    assert lines[-1]["summary"][str(env.namespace)] == {
        env.topic("order"): {"oplog": 20, "collection": 0}, env.topic("customer"): {"oplog": 20, "collection": 0}}
    assert topic_size(env.servers.kafka_bootstrap, env.topic("order")) == 0  # a dry run publishes nothing

    code, lines = replay("--since", _iso(since), "--aggregate-type", "customer", "--aggregate", "customer-1",
                         "--aggregate", "customer-2", "--to-topic", target)
    assert code == 0 and lines[-1]["events"] == 10
    records = read_topic(env.servers.kafka_bootstrap, target)
    assert {r.key for r in records} == {"customer-1", "customer-2"} and len(records) == 10
    assert [r.event["payload"] for r in records if r.key == "customer-1"] == [json.dumps({"seq": s}) for s in (1, 5, 9, 13, 17)]


def _interrupted(env, tmp_path: Path, state: Path, *args: str) -> list[dict]:
    """Run `replay ARGS` as a child, SIGTERM it once it saved progress it had not saved before (130);
    its JSON lines, its log lines under the key "log"."""
    saved = {p: p.read_text() for p in state.glob("*.json")}
    log_path = tmp_path / f"replay-{len(list(tmp_path.glob('replay-*.out')))}.out"
    with log_path.open("w") as log:
        child = spawn([sys.executable, "-m", "relay", "replay", "--state-dir", str(state), *args], stdout=log,
                      stderr=subprocess.STDOUT, env=settings_env(env.settings), cwd=ROOT)
        try:
            wait_until(lambda: any(saved.get(p) != p.read_text() for p in state.glob("*.json")), 60,
                       "the replay's next saved progress")
            child.send_signal(signal.SIGTERM)
            assert child.wait(60) == 130
        finally:
            if child.poll() is None:
                child.kill()
    lines = log_path.read_text().splitlines()
    out = [json.loads(line) for line in lines if line.startswith('{"replay"')]
    return [*out, {"log": [line for line in lines if not line.startswith('{"replay"')]}]


def test_an_interrupted_replay_resumes_where_it_stopped_or_runs_again_with_duplicates_only(env, tmp_path):
    """Interrupted at --rate-limit 50, resumed at the saved rate, interrupted again, resumed with
    --rate-limit 1000 (it overrides the saved rate, saying so): every event once, in order."""
    since = _now() - dt.timedelta(milliseconds=5)
    written = write_events(env.db, env.settings.outbox_collection, 400, writers=2)
    state = tmp_path / "replays"
    *out, _ = _interrupted(env, tmp_path, state, "--since", _iso(since), "--rate-limit", "50")
    replay_id, stopped = out[0]["replay"], out[-1]
    assert out[0]["rateLimit"] == 50
    assert stopped["interrupted"] is True and 0 < stopped["events"] < 400
    assert stopped["resumeWith"].startswith(f"outbox-relay replay --resume {replay_id} --state-dir {state}  # ")
    assert "--rate-limit 50" in stopped["resumeWith"]
    messages = _marked(read_messages(env.servers.kafka_bootstrap, env.topic()), replay_id)
    assert len(messages) == stopped["events"]

    *again, _ = _interrupted(env, tmp_path, state, "--resume", replay_id)
    assert again[0]["rateLimit"] == 50 and again[0]["resumed"] is True  # the saved rate, kept
    done = stopped["events"] + again[-1]["events"]
    assert again[-1]["interrupted"] is True and done < 400

    resumed = _cli(env, "--resume", replay_id, "--state-dir", str(state), "--rate-limit", "1000")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[0])["rateLimit"] == 1000
    assert "--rate-limit 1000 given beside --resume overrides the saved rate limit (50 events/s)" in resumed.stderr
    summary = json.loads(resumed.stdout.splitlines()[-1])
    assert summary["events"] == 400 - done
    records = [r for r in read_topic(env.servers.kafka_bootstrap, env.topic()) if r.headers.get(HEADER_REPLAY) == replay_id]
    verdict = assert_complete_and_ordered(records, written)
    assert not verdict.duplicates  # what was confirmed before each stop is not sent again
    assert not (state / f"{replay_id}.json").exists()  # finished: its state file is removed
    finished = _cli(env, "--resume", replay_id, "--state-dir", str(state))
    assert finished.returncode == 2 and "a finished replay leaves none" in finished.stderr, finished.stderr

    again = _cli(env, "--since", _iso(since), "--state-dir", str(state))
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout.splitlines()[0])["replay"]
    assert second != replay_id
    assert len(_marked(read_messages(env.servers.kafka_bootstrap, env.topic()), second)) == 400


@pytest.mark.parametrize("times", [1, 2, 3, "always"])
def test_the_replays_change_stream_recovers_on_the_live_readers_rule_under_getmore_failures(
        env, replay, monkeypatch, times):
    """`failCommand` on the replay's getMores with a resumable error (docs/architecture.md,
    "Recovery bound"): once, invisible (one reopen at once); twice, the restart policy's first
    restart (at once); three times, its second (after the backoff's first wait); always, a named
    stop once RELAY_CONNECT_TIMEOUT_S has passed without a read, exit 3. Whatever was replayed
    is complete, in order, with no duplicate."""
    since = _now() - dt.timedelta(milliseconds=5)
    written = write_events(env.db, env.settings.outbox_collection, 60, writers=2)
    monkeypatch.setenv("RELAY_CONNECT_TIMEOUT_S", "3")
    mode = "alwaysOn" if times == "always" else {"times": times}
    with failpoint(env.client, mode, failCommands=["getMore"], errorCode=6, errorLabels=["ResumableChangeStreamError"]):
        code, lines = replay("--since", _iso(since))
    err = replay.stderr
    resumed = [line for line in err if "resumed after" in line]
    waits = [float(m[1]) for line in err if (m := re.search(r"failed again: .*opening it again in ([\d.]+) s", line))]
    if times == "always":
        assert code == 3, err
        [stop] = [line for line in err if "ServerUnreachableError" in line]
        assert f"has not served the replay's change stream of {env.namespace}" in stop
        assert "RELAY_CONNECT_TIMEOUT_S" in stop and "HostUnreachable (6)" in stop, stop
        assert "Traceback" not in "\n".join(err) and len(resumed) == 1 and waits[:2] == [0.0, waits[1]], err
        return
    assert code == 0 and lines[-1]["events"] == 60, (lines, err)
    assert len(resumed) == 1, err  # the one reopen at once
    assert len(waits) == times - 1, err  # then the restarts: at once, then after the backoff's first wait
    assert waits[:1] in ([], [0.0]) and all(w > 0 for w in waits[1:]), waits
    records = [r for r in read_topic(env.servers.kafka_bootstrap, env.topic())
               if r.headers.get(HEADER_REPLAY) == lines[0]["replay"]]
    assert not assert_complete_and_ordered(records, written).duplicates


def test_exactly_once_mode_replays_in_transactions_of_its_own(env, replay, monkeypatch):
    since = _now() - dt.timedelta(milliseconds=5)
    _insert(env, [OutboxEvent.new("order", f"a{i % 5}", "Changed", {"seq": i}) for i in range(50)])
    monkeypatch.setenv("RELAY_DELIVERY", "exactly-once")
    code, lines = replay("--since", _iso(since))
    assert code == 0 and lines[-1]["events"] == 50, lines
    # The commit markers are written after commit_transaction returns: read_committed sees them soon.
    committed = lambda: _marked(read_messages(env.servers.kafka_bootstrap, env.topic()), lines[0]["replay"])  # noqa: E731
    wait_until(lambda: len(committed()) == 50, 30, "the replay's transactions committed")
    assert {dict(m.headers())["relay_fencing_token"] for m in committed()} == {b"0"}  # no relay ever ran here


@pytest.fixture(scope="module")
def sasl() -> Iterator[SaslKafka]:
    with sasl_kafka() as server:
        yield server


def test_a_topic_the_acl_refuses_is_one_line_naming_it_and_exit_2(env, sasl):
    """The relay's principal with exactly the relay's ACLs (its topics' prefix) replays to its own
    topics, and is refused a --to-topic outside them: one line naming the topic, exit 2."""
    since = _now() - dt.timedelta(milliseconds=5)
    _insert(env, [OutboxEvent.new("order", "a", "Changed", {"seq": i}) for i in range(3)])
    settings = env.settings.replace(kafka_bootstrap_servers=sasl.broker.bootstrap_servers)
    own, foreign = settings.topic_template.format(aggregateType="order"), f"elsewhere-{uuid.uuid4().hex[:8]}"
    sasl.create_topics(own, foreign)
    user = f"replay-{settings.database}"
    client = sasl.add_user(user, f"pw-{uuid.uuid4().hex}")
    sasl.grant(user, required(settings.topic_template, exactly_once=False, offsets_topic=settings.offsets_topic))
    settings = settings.replace(kafka={**client, "message.timeout.ms": "30000"})

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "relay", "replay", "--since", _iso(since), *args],
                              capture_output=True, text=True, env=settings_env(settings), cwd=ROOT, timeout=120)

    allowed = run()
    assert allowed.returncode == 0 and json.loads(allowed.stdout.splitlines()[-1])["events"] == 3, allowed.stderr
    refused = run("--to-topic", foreign)
    err = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2, refused.stderr
    assert len(err) == 1 and "PermissionDeniedError" in err[0] and foreign in err[0], refused.stderr
    assert "Traceback" not in refused.stderr


def test_bad_input_is_one_line_and_its_exit_code(env):
    now = _now()
    oplog_start = _oplog_start(env)
    _insert(env, [OutboxEvent.new("order", "a", "Changed", {"seq": 1})])
    cases = [
        (2, "--until", ["--since", _iso(now - dt.timedelta(minutes=1)), "--until", _iso(now - dt.timedelta(minutes=2))]),
        (2, "empty", ["--since", _iso(now - dt.timedelta(minutes=1)), "--until", _iso(now - dt.timedelta(minutes=1))]),
        (2, "is not one of the outboxes (RELAY_DATABASE.RELAY_OUTBOX_COLLECTION: ", ["--since", _iso(now), "--outbox", "elsewhere.outbox"]),
        (2, "--to-topic", ["--since", _iso(now - dt.timedelta(minutes=1)), "--to-topic", "no spaces allowed"]),
        (2, "--since", ["--since", "yesterday"]),
        (2, "--resume", ["--resume", str(ObjectId())]),
    ]
    for code, says, args in cases:
        result = _cli(env, *args)
        err = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == code, (args, result.stderr)
        assert len(err) == 1 and says in err[0] and "Traceback" not in result.stderr, (args, result.stderr)
    _remove_one(env)  # with a TTL index below: documents may have been removed, a gap
    env.outbox.create_index("occurredAt", expireAfterSeconds=30 * 86400)
    gone = _cli(env, "--since", _iso(oplog_start - dt.timedelta(hours=2)))
    err = [line for line in gone.stderr.splitlines() if line.strip()]
    assert gone.returncode == 4 and len(err) == 1 and "may be gone" in err[0], gone.stderr
    allowed = _cli(env, "--since", _iso(oplog_start - dt.timedelta(hours=2)), "--allow-gap")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout.splitlines()[-1])["events"] == 2  # the removed one's insert is in the oplog


# ---- the gap check: "may be gone" only where something can have removed the events -----------------

def _remove_one(env) -> None:
    """An event written and deleted: the oplog holds a delete of the outbox (a complete oplog no
    longer proves that nothing was removed)."""
    event = OutboxEvent.new("order", "removed", "Changed", {"seq": 0})
    Outbox(env.outbox).add(event)
    env.outbox.delete_one({"_id": event.event_id})


def _gap_line(replay) -> str:
    [line] = [line for line in replay.stderr if "may be gone" in line]
    return line


def test_on_a_fresh_replica_set_a_range_before_the_oplog_replays_without_a_false_alarm(env, replay):
    """The young deployment of issue 54: the oplog has never rolled over and holds no delete of the
    outbox, so nothing before its start can have been removed: no exit 4, not even a WARNING."""
    oplog_start = _oplog_start(env)
    _insert(env, [OutboxEvent.new("order", "a", "Changed", {"seq": 1})])
    code, lines = replay("--since", _iso(oplog_start - dt.timedelta(hours=2)))
    assert code == 0 and lines[-1]["events"] == 1, (lines, replay.stderr)
    assert [p["from"] for p in lines[0]["parts"][str(env.namespace)]] == ["collection", "oplog"]
    assert not [line for line in replay.stderr if "may be gone" in line]


def test_where_removal_cannot_be_ruled_out_the_gap_names_what_may_have_removed_events_or_none(env, replay):
    """A delete of the outbox in the oplog: the oplog no longer proves nothing was removed. Then no
    TTL index and no clean-up (no relay ever ran: no lease document) still means none; a TTL index,
    clean-up recorded by `outbox prune`, or a lease document that keeps no record (an earlier
    release's) means "may be gone", each named, "or there were none"."""
    oplog_start = _oplog_start(env)
    since = _iso(oplog_start - dt.timedelta(hours=2))
    _remove_one(env)
    _insert(env, [OutboxEvent.new("order", "a", "Changed", {"seq": 1})])
    code, lines = replay("--since", since)
    assert code == 0 and lines[-1]["events"] == 2, (lines, replay.stderr)  # no TTL index, no clean-up

    env.outbox.create_index("occurredAt", name="ttl", expireAfterSeconds=3600)
    assert replay("--since", since)[0] == 4
    assert "a TTL index on occurredAt (3600 s) removes documents, or there were none" in _gap_line(replay)
    env.outbox.drop_index("ttl")

    written = _publish(env, 5)  # the relay ran: its lease document records clean-up from its creation
    assert replay("--since", since)[0] == 0
    assert main(["outbox", "prune"]) == 0  # deletes what the stored checkpoint covers, recording its cutoff
    assert env.outbox.count_documents({}) < len(written.ids) + 1
    cutoff = lease_doc(env.db, env.settings)["cleanedUpBefore"]
    assert replay("--since", since)[0] == 4
    assert f"clean-up removed documents that occurred before {_iso(cutoff)}, or there were none" in _gap_line(replay)

    env.db[env.settings.lease_collection].update_one({"_id": str(env.namespace)},
                                                     {"$unset": {"cleanedUpBefore": ""}})  # as an earlier release
    assert replay("--since", since)[0] == 4
    assert "its lease documents keep no record of it), or there were none" in _gap_line(replay)


@pytest.fixture
def rolled_over(servers):
    """A single-member replica set with a 1 MB oplog that has rolled over."""
    with replica_set("outbox-relay-replay-oplog-", members=1, oplog_size_mb=1, sync_delay_s=1) as rs:
        client = MongoClient(rs.uri, tz_aware=True)
        try:
            for _ in range(120):
                client.filler.pad.insert_many([{"pad": "x" * 10_000} for _ in range(100)])
                first = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
                if first is not None and first.get("o", {}).get("msg") != "initiating set":
                    break
                time.sleep(0.5)  # truncation waits for the next storage checkpoint (--syncdelay 1)
            else:
                raise AssertionError("the oplog did not roll over")
        finally:
            client.close()
        yield rs


def test_after_the_oplog_rolled_over_an_outbox_never_cleaned_up_without_ttl_index_has_no_gap(
        env, replay, rolled_over, monkeypatch):
    monkeypatch.setenv("RELAY_MONGODB_URI", rolled_over.uri)
    client = MongoClient(rolled_over.uri, tz_aware=True)
    try:
        outbox = client[env.settings.database][env.settings.outbox_collection]
        Outbox(outbox).add(OutboxEvent.new("order", "a", "Changed", {"seq": 1}))
        oplog_start = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"].as_datetime()
        since = _iso(oplog_start - dt.timedelta(hours=2))
        code, lines = replay("--since", since, "--dry-run")
        assert code == 0 and lines[-1]["events"] == 1, (lines, replay.stderr)
        outbox.create_index("occurredAt", name="ttl", expireAfterSeconds=3600)
        assert replay("--since", since, "--dry-run")[0] == 4
        assert "removes documents, or there were none" in _gap_line(replay)
    finally:
        client.close()

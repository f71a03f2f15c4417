"""Clean-up by position (RELAY_OUTBOX_RETENTION, `outbox prune`) and the TTL headroom warning,
on real servers (docs/outbox-cleanup.md).

Two oracles. The topic: every event published (`assert_complete_and_ordered`). And the order of
commits: a deleted document whose insert is still in the oplog is still published (an insert
event carries the whole document), so loss by clean-up would show only after a rescan; the soak
therefore replays the database's own change stream (inserts, checkpoint writes, deletes, in
commit order) and checks each delete against the checkpoint stored before it (`DeletionAudit`).
The mutation "delete every candidate without reading the oplog" fails that check."""

from __future__ import annotations

import datetime as dt
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from relay.core.partitions import Scope, partition_of, partitions
from relay.dev.stack import free_port
from relay.outbox import Outbox, OutboxEvent
from tests.support.leases import lease_doc
from tests.support.oracle import all_published, assert_complete_and_ordered
from tests.support.paths import ROOT
from tests.support.relays import RelayProcess, RelayThread, settings_env
from tests.support.soak import size
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events

# Retention 0: every covered document goes, so clean-up runs right behind the relay's position,
# during the backlog (with a longer retention, nothing uncovered is ever old enough to be at risk).
CLEANUP = {"RELAY_OUTBOX_RETENTION": "0", "RELAY_OUTBOX_CHECK_INTERVAL_S": "0.3"}


def _prune(settings, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", "outbox", "prune", *flags], env=settings_env(settings),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


class DeletionAudit(threading.Thread):
    """Reads the database's change stream (the outbox and the lease documents) in commit order and
    checks, at each delete, that the deleting moment's stored checkpoint of the document's
    partition covers its insert (insert cluster time < checkpoint cluster time)."""

    def __init__(self, db, settings) -> None:
        super().__init__(daemon=True)
        self.settings, self.done = settings, threading.Event()
        self.stream = db.watch([{"$match": {"ns.coll": {"$in": [settings.outbox_collection,
                                                                  settings.lease_collection]}}}],
                               max_await_time_ms=200)
        self.inserted: dict = {}  # _id -> (cluster time, partition)
        self.checkpoint: dict[int, object] = {}  # partition -> stored token cluster time
        self.deleted, self.violations = 0, []

    def _partition(self, lease_id: str) -> int:
        return int(lease_id.split("#", 1)[1].split("/", maxsplit=1)[0]) if "#" in lease_id else 0

    def run(self) -> None:
        count = self.settings.partitions
        while not self.done.is_set() or self.stream.try_next() is not None:
            change = self.stream.try_next()
            if change is None:
                continue
            coll, op = change["ns"]["coll"], change["operationType"]
            if coll == self.settings.outbox_collection and op == "insert":
                doc = change["fullDocument"]
                self.inserted[doc["_id"]] = (change["clusterTime"],
                                             partition_of(doc.get("aggregateId"), count))
            elif coll == self.settings.outbox_collection and op == "delete":
                self.deleted += 1
                key = change["documentKey"]["_id"]
                at, k = self.inserted.get(key, (None, 0))
                stored = self.checkpoint.get(k)
                if at is None or stored is None or not at < stored:
                    self.violations.append((key, at, stored))
            elif coll == self.settings.lease_collection and op in ("update", "replace", "insert"):
                fields = (change.get("updateDescription") or {}).get("updatedFields") or change.get("fullDocument") or {}
                if fields.get("tokenClusterTime") is not None:
                    self.checkpoint[self._partition(change["documentKey"]["_id"])] = fields["tokenClusterTime"]

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=60)
        self.stream.close()


class _SizeSampler(threading.Thread):
    """The largest outbox seen, sampled every 0.1 s."""

    def __init__(self, collection) -> None:
        super().__init__(daemon=True)
        self.collection, self.largest, self.done = collection, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.largest = max(self.largest, self.collection.count_documents({}))


@pytest.mark.soak
@pytest.mark.parametrize("mode", ["one-partition", "three-partitions", "exactly-once"])
def test_cleanup_during_a_backlog_with_kills_deletes_only_covered_documents_and_loses_nothing(env, tmp_path, mode):
    """A backlog (suite 2,000 events, soak 8,000) and two writers going on through two kills of the
    relay with clean-up by position on: nothing lost, and no document deleted before the stored
    position covered it. The kills land while the writers commit in either size."""
    changes = {"one-partition": {}, "three-partitions": {"partitions": 3},
               "exactly-once": {"delivery": "exactly-once", "pipeline_depth": 1}}[mode]
    settings = env.settings.replace(**changes)
    outbox = env.db[settings.outbox_collection]
    written = Written()
    writer = threading.Thread(target=write_events, kwargs=dict(
        db=env.db, collection=settings.outbox_collection, total=2000, writers=2, written=written, seed=2,
        pause=lambda: time.sleep(0.01)), daemon=True)
    sampler, audit = _SizeSampler(outbox), DeletionAudit(env.db, settings)
    sampler.start()
    audit.start()
    write_events(env.db, settings.outbox_collection, total=size(2_000, 8_000), writers=4, written=written)  # a backlog
    writer.start()
    rng, runs = random.Random(7), []
    try:
        for i in range(2):
            proc = RelayProcess(settings.replace(instance_id=f"run-{i}"), tmp_path, f"run-{i}", CLEANUP).start()
            runs.append(proc)
            time.sleep(rng.uniform(1.5, 3.0))
            proc.kill()
            time.sleep(1.0)  # the writers add to the backlog while no relay runs
        final = RelayProcess(settings.replace(instance_id="final"), tmp_path, "final", CLEANUP).start()
        runs.append(final)
        writer.join()
        try:
            records = all_published(env, written)
        except AssertionError:
            seen = {r.id for r in read_topic(env.servers.kafka_bootstrap, env.topic())}
            missing = written.ids - seen
            present = {str(d["_id"]) for d in outbox.find({}, {"_id": 1})}
            print(f"\nmissing {len(missing)}, of which still in the outbox {len(missing & present)}")
            print(final.log()[-3000:])
            raise
        verdict = assert_complete_and_ordered(records, written)
        # Every event is published and covered now: clean-up empties the outbox.
        wait_until(lambda: outbox.count_documents({}) == 0, 60, "clean-up to delete every covered document")
        assert final.terminate() == 0, final.log()
        audit.stop()
        assert audit.deleted == len(written.ids), "every delete seen by the audit"
        assert not audit.violations, f"deleted before the checkpoint covered them: {audit.violations[:5]}"
    finally:
        audit.done.set()
        sampler.done.set()
        writer.join()
        for proc in runs:
            proc.stop()
    print(f"\n{mode}: {len(written.ids)} events, {len(verdict.duplicates)} duplicates, "
          f"largest outbox seen {sampler.largest} documents")


def test_prune_dry_run_changes_nothing_and_prune_deletes_only_what_the_checkpoint_covers(env):
    settings = env.settings
    outbox = env.db[settings.outbox_collection]
    refused = _prune(settings, "--dry-run")
    assert refused.returncode == 4 and "checkpoint is unknown" in refused.stderr, refused
    written = write_events(env.db, settings.outbox_collection, total=200, writers=2)
    with RelayThread(settings):
        all_published(env, written, timeout=60)
        wait_until(lambda: (lease_doc(env.db, settings) or {}).get("resumeToken"), 30, "a checkpoint")
    later = [OutboxEvent.new("order", f"late-{i}", "Created", {"n": i}) for i in range(50)]
    Outbox(outbox).add_many(later)  # written after the relay stopped: not covered
    dry = _prune(settings, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete 200 documents" in dry.stdout, dry.stdout
    assert outbox.count_documents({}) == 250, "a dry run deletes nothing"
    assert lease_doc(env.db, settings)["cleanedUpBefore"] is None, "nothing deleted, nothing recorded"
    before = dt.datetime.now(dt.UTC)
    done = _prune(settings)
    assert done.returncode == 0 and "deleted 200 documents" in done.stdout, done
    left = {str(d["_id"]) for d in outbox.find({}, {"_id": 1})}
    assert left == {e.id_str for e in later}, "only the uncovered events are left"
    # The cutoff it deleted below is recorded (replay's gap check reads it): now, retention 0.
    assert lease_doc(env.db, settings)["cleanedUpBefore"] >= before - dt.timedelta(seconds=1)


def test_prune_of_a_partitioned_outbox_refuses_while_one_partition_has_no_position(env):
    settings = env.settings.replace(partitions=3)
    write_events(env.db, settings.outbox_collection, total=30, writers=1)
    leases = env.db[settings.lease_collection]
    ids = [Scope(env.namespace, p).lease_id for p in partitions(3)]
    leases.insert_many([{"_id": i} for i in ids])  # lease documents without checkpoints
    result = _prune(settings)
    assert result.returncode == 4 and all(i in result.stderr for i in ids), result.stderr
    assert env.db[settings.outbox_collection].count_documents({}) == 30


def test_ttl_headroom_warns_and_degrades_readyz_when_a_stopped_leader_lets_it_shrink(env, tmp_path):
    """A paused leader keeps its lease; a standby replica measures the outbox and sees the oldest
    undelivered event age towards the TTL index's expiry."""
    settings = env.settings.replace(lease_ttl_s=120.0)
    init = subprocess.run([sys.executable, "-m", "relay", "outbox", "init", "--ttl-seconds", "3600"],
                          env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert init.returncode == 0 and "RELAY_OUTBOX_RETENTION" in init.stdout, init
    leader = RelayProcess(settings.replace(instance_id="leader"), tmp_path, "leader").start()
    port = free_port()
    standby = RelayProcess(settings.replace(instance_id="standby", http_port=port), tmp_path, "standby",
                           {"RELAY_OUTBOX_CHECK_INTERVAL_S": "0.3", "RELAY_TTL_HEADROOM_WARN_S": "600"})
    try:
        wait_until(lambda: (d := lease_doc(env.db, settings)) and d.get("owner") == "leader" and d.get("resumeToken"),
                   60, "the leader to store a checkpoint")
        standby.start()
        leader.pause()
        # 300 s before the TTL index deletes it
        old = OutboxEvent.new("order", "o-1", "Created", {"n": 1},
                              occurred_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=3300))
        Outbox(env.db[settings.outbox_collection]).add(old)

        def readyz() -> dict:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                    return json.loads(answer.read())
            except OSError:  # not listening yet, or 503 while it starts
                return {}
        body = wait_until(lambda: (b := readyz()).get("status") == "degraded" and b, 60, "/readyz degraded")
        assert "TTL headroom" in body["degraded"] and body["ok"] is True
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        headroom = float(next(line.split()[-1] for line in metrics.splitlines()
                              if line.startswith("relay_outbox_ttl_headroom_seconds{")))
        assert 0 < headroom < 600, headroom
        assert "WARNING" in standby.log() or '"level": "WARNING"' in standby.log()
        assert "TTL headroom" in standby.log()
    finally:
        leader.stop()
        standby.stop()

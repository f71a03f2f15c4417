"""Checkpoints stored per process (RELAY_CHECKPOINT_INTERVAL_MS; docs/architecture.md "Checkpoints",
docs/faults.md row 17), on real servers: the checkpoints of every scope one process leads are stored
together, at most once per interval, each under its own lease.

- A relay of three outboxes SIGKILLed inside the interval loses nothing; each run publishes again
  only what lies after the checkpoint stored for that outbox when it started; the checkpoints it left
  were stored within about one interval of the kill; clean-up by checkpoint deletes only what the
  stored checkpoint covered at the time (the database's own change stream replayed in commit order,
  as tests/faults/test_outbox_cleanup.py does for one outbox).
- Two processes leading different outboxes (and partitions) of one database, one killed: the other
  takes its scopes over from the checkpoints it stored.
- One scope's lease taken by another owner: the process goes on storing the others', nothing of
  the lost one is stored under its old fencing token, and it publishes it again once it is back.
- A relay upgraded in place from the release before this change (its tree from git) reads the
  checkpoints it stored, at-least-once and exactly-once (read_committed: each event once).
"""

from __future__ import annotations

import datetime as dt
import random
import re
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from relay.commands.status import status
from relay.config import Settings
from relay.config.table import public_fields
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.core.partitions import Partition, Scope, partition_of
from tests.support.leases import LeaseHistory
from tests.support.oracle import Verdict, assert_complete_and_ordered
from tests.support.paths import ROOT
from tests.support.relays import ChildProcess, RelayProcess, settings_env
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events

INTERVAL_MS = 2000
# Room past the interval for a stored checkpoint's age at a kill: one read (RELAY_MAX_AWAIT_MS is 200
# in the tests), the parcel in flight, and a busy machine. A relay that stored only on a stop
# would be far past it.
LEEWAY_S = 4.0
CLEANUP = {"RELAY_OUTBOX_RETENTION": "0", "RELAY_OUTBOX_CHECK_INTERVAL_S": "0.3"}
BEFORE_THIS_CHANGE = "a82858f"  # the release whose relay stored each checkpoint alone, after every batch


@dataclass
class Box:
    """Outboxes `a`, `b`, `c` (and `d`) of the test's database, each routed to its own topic."""

    env: Any
    collections: list[str]

    @property
    def names(self) -> list[str]:
        return [f"{self.env.settings.database}.{c}" for c in self.collections]

    def settings(self, **changes: Any) -> Settings:
        prefix = self.env.topic().split(".", 1)[0]
        return self.env.settings.replace(outboxes=",".join(self.names),
                                         topic_template=prefix + ".{collection}.{aggregateType}", **changes)

    def topic(self, collection: str) -> str:
        return self.settings().topic_template.format(collection=collection, aggregateType="order")

    def leases(self) -> dict[str, dict[str, Any]]:
        """Every lease document with the server's time (`serverTime`), by lease id."""
        coll = self.env.db[self.env.settings.lease_collection]
        return {str(d["_id"]): d for d in coll.aggregate([{"$addFields": {"serverTime": "$$NOW"}}])}

    def published(self, collection: str, written: Written, isolation: str = "read_committed") -> list[Any]:
        def done() -> list[Any] | None:
            records = read_topic(self.env.servers.kafka_bootstrap, self.topic(collection), isolation=isolation)
            return records if {r.id for r in records} >= written.ids else None

        return wait_until(done, 180, f"every event of outbox {collection}", interval=1)


def _box(env: Any, collections: list[str]) -> Box:
    for c in collections:
        env.db.create_collection(c)
    return Box(env, collections)


@pytest.fixture
def box(env) -> Box:
    return _box(env, ["a", "b", "c"])


def _writers(box: Box, total: int, seed: int = 1) -> tuple[dict[str, Written], list[threading.Thread]]:
    """`total` events into each outbox at about 100 events/s each, started."""
    written = {c: Written() for c in box.collections}
    threads = [threading.Thread(target=write_events, daemon=True, kwargs=dict(
        db=box.env.db, collection=c, total=total, writers=1, max_per_txn=3, written=written[c], seed=seed + k,
        pause=lambda: time.sleep(0.02))) for k, c in enumerate(box.collections)]
    for t in threads:
        t.start()
    return written, threads


def _replayed_only_after_stored(verdict: Verdict, resumed_from: dict[int, str | None]) -> None:
    """Each duplicate comes from a later run, after the checkpoint that run's lease held when taken."""
    for dup in verdict.duplicates:
        assert dup.fencing > verdict.first[dup.id].fencing, dup
        assert dup.position > (resumed_from.get(dup.fencing) or ""), (
            f"event {dup.id} published again by fencing token {dup.fencing}, before the checkpoint it resumed from")


class PositionAudit(threading.Thread):
    """Replays the database's change stream (the outboxes and the lease documents, in commit order)
    and checks at each delete that the checkpoint stored for that outbox at that moment covers the
    deleted document's insert."""

    def __init__(self, box: Box) -> None:
        super().__init__(daemon=True)
        settings = box.env.settings
        self.leases, self.database, self.done = settings.lease_collection, settings.database, threading.Event()
        self.stream = box.env.db.watch([{"$match": {"ns.coll": {"$in": [*box.collections, self.leases]}}}],
                                       max_await_time_ms=200)
        self.inserted: dict[Any, tuple[Any, str]] = {}  # _id -> (cluster time, lease id)
        self.stored: dict[str, Any] = {}  # lease id -> stored checkpoint's cluster time
        self.deleted, self.violations = 0, []

    def run(self) -> None:
        while not self.done.is_set() or self.stream.try_next() is not None:
            change = self.stream.try_next()
            if change is None:
                continue
            coll, op = change["ns"]["coll"], change["operationType"]
            if coll == self.leases:
                fields = (change.get("updateDescription") or {}).get("updatedFields") or change.get("fullDocument") or {}
                if fields.get("tokenClusterTime") is not None:
                    self.stored[str(change["documentKey"]["_id"])] = fields["tokenClusterTime"]
            elif op == "insert":
                self.inserted[change["documentKey"]["_id"]] = (change["clusterTime"], f"{self.database}.{coll}")
            elif op == "delete":
                self.deleted += 1
                at, lease = self.inserted.get(change["documentKey"]["_id"], (None, ""))
                stored = self.stored.get(lease)
                if at is None or stored is None or not at < stored:
                    self.violations.append((change["documentKey"]["_id"], at, stored))

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=60)
        self.stream.close()


# ---- killed inside the interval -----------------------------------------------------------------

@pytest.mark.soak
def test_a_relay_of_three_outboxes_killed_inside_the_interval_loses_nothing_and_cleans_up_only_behind_stored_positions(
        box, tmp_path):
    env = box.env
    settings = box.settings(checkpoint_interval_ms=INTERVAL_MS)
    rng = random.Random(44)
    history = LeaseHistory(env.db, settings)
    audit = PositionAudit(box)
    audit.start()
    runs: list[RelayProcess] = []
    with history:
        written, writers = _writers(box, 600)
        try:
            for i in range(2):
                proc = RelayProcess(settings.replace(instance_id=f"run-{i}"), tmp_path, f"run-{i}", CLEANUP).start()
                runs.append(proc)
                wait_until(lambda i=i: all(d.get("owner") == f"run-{i}" for d in box.leases().values())
                           and len(box.leases()) == 3, 60, f"run {i} to lead every outbox")
                time.sleep(rng.uniform(INTERVAL_MS / 1000 + 0.5, INTERVAL_MS / 1000 + 2.0))
                proc.kill()
                for lid, doc in box.leases().items():
                    age = (doc["serverTime"] - doc["checkpointAt"]).total_seconds()
                    assert age <= INTERVAL_MS / 1000 + LEEWAY_S, f"{lid}: checkpoint stored {age:.1f} s before the kill"
                time.sleep(0.5)  # the writers go on while no relay runs
            final = RelayProcess(settings.replace(instance_id="final"), tmp_path, "final", CLEANUP).start()
            runs.append(final)
            # It takes over from the stored checkpoints, and is past its start-up when it is stopped
            # (a SIGTERM while Python still imports it would end it by the signal, not exit 0).
            wait_until(lambda: all(d.get("owner") == "final" for d in box.leases().values())
                       and len(box.leases()) == 3, 60, "the final run to lead every outbox")
            for t in writers:
                t.join()
            verdicts = {c: assert_complete_and_ordered(box.published(c, written[c], "read_uncommitted"), written[c])
                        for c in box.collections}
            wait_until(lambda: all(env.db[c].count_documents({}) == 0 for c in box.collections), 60,
                       "clean-up to delete every covered document")
            assert final.terminate() == 0, final.log()
        finally:
            for t in writers:
                t.join(timeout=60)
            for proc in runs:
                proc.stop()
    audit.stop()
    for c, verdict in verdicts.items():
        _replayed_only_after_stored(verdict, history.resumed_from(f"{env.settings.database}.{c}"))
    history.assert_never_went_backwards()
    assert audit.deleted == sum(len(w.ids) for w in written.values()), "every delete seen by the audit"
    assert not audit.violations, f"deleted before the stored checkpoint covered them: {audit.violations[:5]}"
    print(f"\n{sum(len(w.ids) for w in written.values())} events in 3 outboxes, 2 kills, duplicates per outbox "
          f"{ {c: len(v.duplicates) for c, v in verdicts.items()} }")


# ---- two processes -----------------------------------------------------------------------------------

def _owners(box: Box) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in box.leases().values():
        if d.get("owner") is not None and d["expiresAt"] > d["serverTime"]:
            counts[d["owner"]] = counts.get(d["owner"], 0) + 1
    return counts


@pytest.mark.soak
def test_two_processes_leading_different_outboxes_one_killed_the_other_takes_over_from_its_stored_positions(
        env, tmp_path):
    box = _box(env, ["a", "b", "c", "d"])
    settings = box.settings(checkpoint_interval_ms=INTERVAL_MS, partitions=2)  # 8 scopes, shared out
    history = LeaseHistory(env.db, settings)
    procs: dict[str, RelayProcess] = {}
    with history:
        written, writers = _writers(box, 400)
        try:
            for name in ("A", "B"):
                procs[name] = RelayProcess(settings.replace(instance_id=name), tmp_path, name).start()
            wait_until(lambda: _owners(box) == {"A": 4, "B": 4}, 90, "each process to lead four scopes")
            time.sleep(INTERVAL_MS / 1000 + 1.0)
            killed = {lid for lid, d in box.leases().items() if d.get("owner") == "A"}
            procs["A"].kill()
            wait_until(lambda: _owners(box) == {"B": 8}, 60, "B to take over A's scopes")
            for t in writers:
                t.join()
            verdicts = {c: assert_complete_and_ordered(box.published(c, written[c], "read_uncommitted"), written[c])
                        for c in box.collections}
            assert procs["B"].terminate() == 0, procs["B"].log()
        finally:
            for t in writers:
                t.join(timeout=60)
            for p in procs.values():
                p.stop()
    history.assert_never_went_backwards()
    assert len(killed) == 4
    for c, verdict in verdicts.items():
        for dup in verdict.duplicates:  # each lease's fencing tokens are its own: find the record's lease
            lid = Scope(Namespace(env.settings.database, c), Partition(partition_of(dup.key, 2), 2)).lease_id
            assert dup.fencing > verdict.first[dup.id].fencing, dup
            assert dup.position > (history.resumed_from(lid).get(dup.fencing) or ""), (
                f"{lid}: event {dup.id} published again before the checkpoint its new leader resumed from")
    print(f"\nA killed leading {sorted(killed)}; duplicates per outbox "
          f"{ {c: len(v.duplicates) for c, v in verdicts.items()} }")


# ---- one scope's lease lost --------------------------------------------------------------------------

def test_a_process_that_loses_one_scopes_lease_keeps_storing_the_others(box, tmp_path):
    env = box.env
    settings = box.settings(checkpoint_interval_ms=1000)
    leases = env.db[settings.lease_collection]
    lost = f"{settings.database}.b"
    proc = RelayProcess(settings, tmp_path, "relay").start()
    try:
        wait_until(lambda: _owners(box) == {settings.instance_id: 3}, 60, "the relay to lead every outbox")
        # Another owner takes b's lease while the relay runs (as a takeover would), and keeps it.
        taken = leases.find_one_and_update(
            {"_id": lost}, [{"$set": {"owner": "intruder", "fencingToken": {"$add": ["$fencingToken", 1]},
                                      "expiresAt": {"$add": ["$$NOW", 3_600_000]}}}], return_document=True)
        written, writers = _writers(box, 200)
        for t in writers:
            t.join()
        for c in ("a", "c"):
            assert_complete_and_ordered(box.published(c, written[c], "read_uncommitted"), written[c])
        wait_until(lambda: all(box.leases()[f"{settings.database}.{c}"]["resumeToken"]["_data"] >= max(
            r.position for r in read_topic(env.servers.kafka_bootstrap, box.topic(c))) for c in ("a", "c")),
            30, "a's and c's checkpoints stored past their last events")
        doc = box.leases()[lost]
        assert (doc["owner"], doc["fencingToken"], doc.get("resumeToken")) == (
            "intruder", taken["fencingToken"], taken.get("resumeToken")), "nothing stored under the lost lease"
        assert proc.alive, "the process goes on"
        assert "lease on " + lost + " lost" in proc.log()
        shown = status(settings)
        assert shown["checkpointIntervalMs"] == 1000 and "1 s" in shown["duplicateWindow"]
        # a's and c's checkpoints are stored; b's only if the relay stored one before the intruder came.
        ages = [row["checkpoint"]["storedSecondsAgo"] for o in shown["outboxes"].values() for row in o["leases"]
                if row["checkpoint"] is not None]
        assert len(ages) >= 2 and all(age >= 0 for age in ages), ages
        leases.update_one({"_id": lost}, [{"$set": {"expiresAt": "$$NOW"}}])  # the intruder lets it expire
        assert_complete_and_ordered(box.published("b", written["b"], "read_uncommitted"), written["b"])
        assert proc.terminate() == 0, proc.log()
    finally:
        proc.stop()


# ---- upgraded in place -------------------------------------------------------------------------------

def _declared(tree: Path) -> set[str]:
    """The settings the release in `tree` declared (its relay/config.py: `name: type = _setting(`)."""
    return set(re.findall(r"^    (\w+): [^=\n]+= _setting\(", (tree / "relay" / "config.py").read_text(), re.M))


class EarlierRelay(ChildProcess):
    """`outbox-relay run` of the release before this change (`tree`: its files from git; no compiled
    module there, so it reads with pymongo's bson), with the settings it knew."""

    def __init__(self, tree: Path, settings: Settings, log_dir: Path, name: str) -> None:
        self.tree, self.settings = tree, settings
        self.log_path = log_dir / f"{name}.log"

    def argv(self) -> list[str]:
        return [sys.executable, "-P", "-m", "relay", "run"]  # -P: the tree's relay, not the checkout's

    def environ(self) -> dict[str, str]:
        env = settings_env(self.settings)
        known = _declared(self.tree)
        for field in public_fields():  # a setting it did not have (RELAY_BROKER ...): it would refuse it as unknown
            if field.name not in known:
                env.pop(env_name(field.name), None)
        return env | {"PYTHONPATH": str(self.tree)}


@pytest.fixture(scope="module")
def earlier_tree(tmp_path_factory) -> Path:
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BEFORE_THIS_CHANGE}^{{commit}}"],
                           capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"commit {BEFORE_THIS_CHANGE} (the release before this change) is not in this clone")
    tree = tmp_path_factory.mktemp("earlier")
    archive = tree / "relay.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), BEFORE_THIS_CHANGE, "relay", "schemas"],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_a_relay_upgraded_in_place_resumes_from_the_positions_the_earlier_release_stored(
        box, tmp_path, earlier_tree, delivery):
    env = box.env
    prefix = env.topic().split(".", 1)[0]
    settings = box.settings(delivery=delivery, offsets_topic=f"{prefix}.offsets")
    isolation = "read_committed" if delivery == "exactly-once" else "read_uncommitted"
    history = LeaseHistory(env.db, settings)
    with history:
        written, writers = _writers(box, 300)
        old = EarlierRelay(earlier_tree, settings.replace(instance_id="earlier"), tmp_path, "earlier").start()
        try:
            wait_until(lambda: all(d.get("resumeToken") for d in box.leases().values()) and len(box.leases()) == 3,
                       90, "the earlier release to store a checkpoint of every outbox")
            time.sleep(1.0)
            old.kill()  # killed: the new release resumes from what the earlier one stored, and nothing else
            stored = {lid: d["resumeToken"]["_data"] for lid, d in box.leases().items()}
            new = RelayProcess(settings.replace(instance_id="new", checkpoint_interval_ms=INTERVAL_MS), tmp_path,
                               "new").start()
            wait_until(lambda: all(d.get("owner") == "new" for d in box.leases().values()), 60,
                       "the new release to lead every outbox")  # past its start-up when stopped
            for t in writers:
                t.join()
            verdicts = {c: assert_complete_and_ordered(box.published(c, written[c], isolation), written[c])
                        for c in box.collections}
            assert new.terminate() == 0, new.log()
        finally:
            for t in writers:
                t.join(timeout=60)
            old.stop()
            if "new" in locals():
                new.stop()
    assert "Traceback" not in old.log(), old.log()[-3000:]
    for c, verdict in verdicts.items():
        lid = f"{env.settings.database}.{c}"
        resumed = history.resumed_from(lid)
        new_token = max(resumed)
        if delivery == "exactly-once":
            assert not verdict.duplicates, f"{c}: read_committed sees each event once across the upgrade"
        else:
            assert resumed[new_token] == stored[lid], f"{c}: the new release took the lease at the stored checkpoint"
            _replayed_only_after_stored(verdict, resumed)
    print(f"\n{delivery}: duplicates per outbox {({c: len(v.duplicates) for c, v in verdicts.items()})}, "
          f"at {dt.datetime.now(dt.UTC):%H:%M:%S}")

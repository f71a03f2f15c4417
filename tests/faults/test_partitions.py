"""A group of relay processes sharing a partitioned outbox (RELAY_PARTITIONS > 1, docs/partitions.md):
rebalancing as replicas join and leave, and a chaos run with kills, pauses past the lease, a
replica joining and one leaving, checked with the oracle (docs/faults.md) per partition."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from relay.commands.status import status
from relay.core.partitions import Partition, Scope, partition_of
from tests.support.leases import LeaseHistory
from tests.support.oracle import all_published, assert_complete_and_ordered
from tests.support.relays import RelayProcess
from tests.support.soak import size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes


def _leading(settings) -> dict[str, list[int]]:
    """Who leads which partition, from `outbox-relay status` (unexpired leases, server clock)."""
    return {r["instance"]: r["leading"] for r in status(settings)["replicas"] if r["leading"]}


def _counts(settings) -> dict[str, int]:
    return {k: len(v) for k, v in _leading(settings).items()}


def _doc(env, settings, k: int) -> dict[str, Any]:
    return env.db[settings.lease_collection].find_one({"_id": Scope(settings.namespaces[0], Partition(k, settings.partitions)).lease_id})


def _member(env, settings, instance: str) -> dict[str, Any] | None:
    return env.db[f"{settings.lease_collection}_replicas"].find_one({"_id": f"{settings.namespaces[0]}#group/{instance}"})


def test_three_replicas_share_six_partitions_and_the_two_left_take_over_a_stopped_ones_share(env, tmp_path):
    """A and B lead 3 partitions each; C joins: each comes to lead 2, A and B handing one over each
    at a batch boundary (released, then taken: no lease is left to expire); C is SIGTERMed: it
    releases its leases and A and B lead 3 each again. The order is read from the lease documents'
    server times; the waits are generous; writes run throughout and the oracle checks the topic."""
    ttl = 6.0
    settings = env.settings.replace(partitions=6, lease_ttl_s=ttl)
    procs = {name: RelayProcess(settings.replace(instance_id=name), tmp_path, name) for name in "ABC"}
    written = Written()
    try:
        procs["A"].start()
        procs["B"].start()
        wait_until(lambda: _counts(settings) == {"A": 3, "B": 3}, 90, "A and B leading 3 each")
        writer = background_writes(env, written, 6000, writers=2, pause=0.01)
        procs["C"].start()
        joined = wait_until(lambda: (m := _member(env, settings, "C")) and m["joinedAt"], 60, "C's first heartbeat")
        wait_until(lambda: _counts(settings) == {"A": 2, "B": 2, "C": 2}, 20 * ttl, "2 partitions each")
        c_parts = _leading(settings)["C"]
        for k in c_parts:  # handed over, not left to expire: released by A or B, then taken by C
            doc = _doc(env, settings, k)
            assert joined <= doc["releasedAt"] <= doc["acquiredAt"], (k, doc)
        took = max(_doc(env, settings, k)["acquiredAt"] for k in c_parts) - joined  # reported below

        assert procs["C"].terminate() == 0, procs["C"].log()
        left = _member(env, settings, "C")["leftAt"]
        wait_until(lambda: _counts(settings) == {"A": 3, "B": 3}, 20 * ttl, "A and B leading 3 each again")
        for k in c_parts:  # C released its leases on the way out; A or B took each after that
            doc = _doc(env, settings, k)
            assert doc["owner"] in ("A", "B") and left <= doc["releasedAt"] <= doc["acquiredAt"], (k, doc)
        back = max(_doc(env, settings, k)["acquiredAt"] for k in c_parts) - left  # reported below
        writer.join()
        records = all_published(env, written)
    finally:
        for proc in procs.values():
            proc.stop()
    verdict = assert_complete_and_ordered(records, written)
    print(f"\nrebalancing, 6 partitions (lease TTL {ttl:g} s): C had its 2 partitions "
          f"{took.total_seconds():.1f} s after joining; A and B took them back {back.total_seconds():.1f} s "
          f"after C left; {len(written.ids)} events, {len(verdict.duplicates)} duplicates")


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_chaos_four_partitions_three_replicas_kills_pauses_joins_and_leaves(env, tmp_path):
    """4 partitions, 3 relay processes, at least 25,000 events (the suite: 6,000, at a slower pace;
    the writers go on until the last fault, so every fault lands while they are written) from 4
    writers in transactions of up to 5;
    meanwhile kills (SIGKILL, a new replica replaces it), pauses past the lease (SIGSTOP, SIGCONT),
    a replica joining and one leaving gracefully (SIGTERM). Then: nothing lost, per-aggregate
    order kept, every message published after the checkpoint its partition's lease resumed from
    (so every duplicate is), no checkpoint moved back, and every partition led at the end."""
    n, total = 4, size(6_000, 25_000)
    settings = env.settings.replace(partitions=n)
    rng = random.Random(11)
    written = Written()
    procs: dict[str, RelayProcess] = {}
    started: list[RelayProcess] = []
    faults: list[str] = []
    faults_done = threading.Event()

    def launch() -> str:
        name = f"r{len(started) + 1}-{uuid.uuid4().hex[:4]}"
        procs[name] = RelayProcess(settings.replace(instance_id=name), tmp_path, name).start()
        started.append(procs[name])
        return name

    def victim() -> str:
        """Mostly a replica that leads partitions: that is where faults hurt."""
        leading = [r for r, parts in _leading(settings).items() if parts and r in procs]
        return rng.choice(leading) if leading and rng.random() < 0.8 else rng.choice(sorted(procs))

    with LeaseHistory(env.db, settings) as history:
        try:
            for _ in range(3):
                launch()
            wait_until(lambda: sum(_counts(settings).values()) == n, 90, "every partition led")
            writer = background_writes(env, written, total, writers=4, pause=size(0.06, 0.004), max_per_txn=5,
                                       until=faults_done)
            actions = ["kill", "kill", "pause", "pause", "join", "leave"]
            rng.shuffle(actions)
            for action in actions:
                time.sleep(rng.uniform(2.0, 4.0))
                if action == "join":
                    faults.append(f"join:{launch()}")
                    continue
                name = victim()
                if action == "kill":
                    procs.pop(name).kill()
                    faults.append(f"kill:{name}")
                    launch()
                elif action == "pause":
                    procs[name].pause()
                    time.sleep(settings.lease_ttl_s + 1)
                    procs[name].resume()
                    faults.append(f"pause:{name}")
                else:
                    assert procs.pop(name).terminate() == 0
                    faults.append(f"leave:{name}")
            faults_done.set()
            writer.join()
            records = all_published(env, written, timeout=300)
            led = wait_until(lambda: (c := _leading(settings)) and sum(map(len, c.values())) == n and c, 60,
                             "every partition led at the end")
            assert set(led) <= set(procs), f"leaders {set(led)} are live replicas {set(procs)}"
        finally:
            faults_done.set()
            for proc in started:
                proc.stop()
    verdict = assert_complete_and_ordered(records, written)
    assert len(written.ids) >= total
    stores = history.assert_never_went_backwards()
    resumed = {k: history.resumed_from(Scope(settings.namespaces[0], Partition(k, n)).lease_id) for k in range(n)}
    late = []
    for r in records:
        start = resumed[partition_of(r.key, n)].get(r.fencing)
        if start is not None and not r.position > start:
            late.append(r)
    assert not late, (f"{len(late)} messages at or before the checkpoint their partition resumed from, "
                      f"e.g. {late[0].id} at {late[0].position}")
    takeovers = sum(len(v) - 1 for v in resumed.values())
    per_partition = Counter(partition_of(r.key, n) for r in verdict.duplicates)
    print(f"\nchaos, {n} partitions: {len(written.ids)} events, faults {faults}, {len(verdict.duplicates)} "
          f"duplicates {dict(sorted(per_partition.items()))}, {takeovers} takeovers, {stores} checkpoints "
          f"stored, leaders at the end {led}")

"""A three-member replica set: elections (docs/faults.md row 3) and the chaos run."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pymongo
import pytest
from pymongo.errors import PyMongoError

from relay.core.errors import EXIT_UNREACHABLE
from tests.support.leases import CheckpointWatcher, lease_doc
from tests.support.oracle import all_published, assert_complete_and_ordered
from tests.support.relays import RelayProcess, RelayThread
from tests.support.servers import needs_local_stack
from tests.support.soak import size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes

# The chaos run's events: four writers keep writing through all seven faults (about 30 s of them);
# `make test` writes a quarter of them, paced to last as long, through the same faults.
EVENTS = size(6_000, 25_000)
PAUSE = size(0.05, 0.004)  # seconds between a writer's transactions


def _step_down(rs) -> None:
    with pymongo.MongoClient(rs.uri) as client:
        try:
            client.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
        except PyMongoError:
            pass  # the primary closes connections as it steps down


def _kill_primary_and_restart(rs) -> None:
    index = rs.primary_index()
    rs.processes[index].kill()
    rs.wait_for_primary()
    rs.restart_member(index)




@pytest.mark.soak
@pytest.mark.parametrize("partitions", [1, 3], ids=["one-position", "three-positions-per-write"])
def test_primary_steps_down_then_dies_without_loss_or_reorder(env3, rs3, partitions):
    """A step-down a quarter into the writes, the primary SIGKILLed past half of them: every event
    published once at least, in order per aggregate, no checkpoint moved back. With three
    partitions one process stores three positions per write, in one MongoDB transaction
    (relay.mongo.checkpoints): the step-down and the kill hit transactions too. At the suite's size
    (1,500 events at a slower pace) both faults still land while the writers are busy."""
    total = size(1_500, 4_000)
    written = Written()
    settings = env3.settings.replace(partitions=partitions)
    with RelayThread(settings) as relay, CheckpointWatcher(env3.db, env3.settings) as watcher:
        writer = background_writes(env3, written, total, writers=4, pause=size(0.027, 0.01), max_per_txn=5)
        wait_until(lambda: len(written.ids) > total // 4, 60, "writes under way")
        _step_down(rs3)
        wait_until(lambda: len(written.ids) > total * 5 // 8, 90, "writes after the step-down")
        _kill_primary_and_restart(rs3)
        writer.join()
        records = all_published(env3, written)
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(records, written)
    watcher.assert_never_went_backwards()
    print(f"\nstep-down + primary SIGKILL: {len(written.ids)} events, {len(verdict.duplicates)} duplicates")


@pytest.mark.soak
@pytest.mark.timeout(1200)  # its waits add up to more than the suite's 600 s on a slow machine
def test_chaos_two_replicas_kills_pauses_broker_restart_and_step_down(env3, rs3, tmp_path):
    """Two relay processes on a three-member replica set; while four writers commit, seven faults
    in random order: three kills of a replica (a new one replaces it), two pauses past the lease,
    the broker killed and restarted, a primary step-down. Then nothing lost, per-aggregate order
    kept, no checkpoint moved back. The suite writes at least 6,000 events (the soak 25,000) at a
    slower pace, and the writers go on until the last fault: every fault lands while they are busy."""
    broker = needs_local_stack(env3.servers).kafka
    rng = random.Random(50_000)
    written = Written()
    relays: dict[str, RelayProcess] = {}
    started: list[RelayProcess] = []

    def launch(slot: str) -> None:
        name = f"{slot}-{uuid.uuid4().hex[:4]}"
        proc = RelayProcess(env3.settings.replace(instance_id=name), tmp_path, name).start()
        relays[slot] = proc
        started.append(proc)

    def supervise() -> None:
        """What the relay's container gets from `restart: unless-stopped` (docker-compose.yml): a
        replica still starting when the broker went down gives up after RELAY_CONNECT_TIMEOUT_S
        (exit 3, Kafka unreachable at start) and is started again. Any other exit fails the run."""
        for slot, proc in list(relays.items()):
            if proc.alive:
                continue
            assert proc.returncode == EXIT_UNREACHABLE, \
                f"{proc.log_path.stem} exited {proc.returncode}:\n{proc.log()[-4000:]}"
            faults.append(f"restart:{slot}")
            launch(slot)

    launch("r1")
    launch("r2")
    faults: list[str] = []
    faults_done = threading.Event()
    try:
        with CheckpointWatcher(env3.db, env3.settings) as watcher:
            writer = background_writes(env3, written, EVENTS, writers=4, pause=PAUSE, max_per_txn=5, until=faults_done)
            actions = ["kill", "kill", "kill", "pause", "pause", "broker", "step-down"]
            rng.shuffle(actions)
            for action in actions:
                time.sleep(rng.uniform(2.0, 5.0))
                supervise()
                owner = str((lease_doc(env3.db, env3.settings) or {}).get("owner") or "")
                leader = owner.split("-", maxsplit=1)[0] if owner.startswith(("r1-", "r2-")) else "r1"
                # Mostly hit the replica that holds the lease: that is where faults hurt.
                slot = leader if rng.random() < 0.75 else ("r2" if leader == "r1" else "r1")
                if action == "kill":
                    relays[slot].kill()
                    launch(slot)
                elif action == "pause":
                    relays[slot].pause()
                    time.sleep(env3.settings.lease_ttl_s + 1)
                    relays[slot].resume()
                elif action == "broker":
                    broker.process.kill()
                    time.sleep(2)
                    broker.start()
                else:
                    _step_down(rs3)
                faults.append(f"{action}:{slot}" if action in ("kill", "pause") else action)
            faults_done.set()
            writer.join()
            supervise()
            records = all_published(env3, written, timeout=300)
    finally:
        faults_done.set()
        for proc in started:
            proc.stop()
    verdict = assert_complete_and_ordered(records, written)
    watcher.assert_never_went_backwards()
    assert len(written.ids) >= EVENTS
    print(f"\nchaos: {len(written.ids)} events, faults {faults}, {len(verdict.duplicates)} duplicates, "
          f"fencing tokens {sorted({r.fencing for r in records})}")

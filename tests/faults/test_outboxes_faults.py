"""Many outboxes through kills (RELAY_OUTBOXES; docs/outboxes.md): three outboxes in two databases
written at the same time, two replicas, the leader SIGKILLed during the backlog and restarted.
Every event of every outbox is delivered, first copies in commit order per aggregate; in
exactly-once mode read_committed consumers see each event once; with partitions the same holds
for each of the six leases.
"""

from __future__ import annotations

import collections
import random
import threading
import time

import pytest

from tests.integration.test_outboxes import Outboxes, outboxes  # noqa: F401 - the fixture
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayProcess
from tests.support.soak import size
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events

pytestmark = pytest.mark.soak


def _leader(env, procs: dict[str, RelayProcess], names: list[str]) -> str | None:
    """The replica holding the most of the outboxes' leases now."""
    ours = [d for d in env.db[env.settings.lease_collection].find()
            if any(str(d["_id"]) == n or str(d["_id"]).startswith(n + "#") for n in names)]
    owners = collections.Counter(d.get("owner") for d in ours if d.get("owner") in procs)
    return owners.most_common(1)[0][0] if owners else None


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param({}, id="at-least-once"),
        pytest.param({"delivery": "exactly-once"}, id="exactly-once"),
        pytest.param({"partitions": 2}, id="partitions"),
    ],
)
def test_three_outboxes_two_replicas_leader_killed_during_a_backlog_lose_nothing(outboxes, env, tmp_path, mode):  # noqa: F811
    box: Outboxes = outboxes
    prefix = env.topic().split(".", 1)[0]
    settings = box.settings.replace(offsets_topic=f"{prefix}.offsets", **mode)
    rng = random.Random(3)
    written = {n: Written() for n in box.names}

    def writer(name: str) -> None:
        db, coll = name.split(".")
        write_events(env.client[db], coll, size(600, 1_500), writers=2, max_per_txn=5, written=written[name],
                     seed=hash(name) % 100, pause=lambda: time.sleep(size(0.03, 0.01)))

    writers = [threading.Thread(target=writer, args=(n,), daemon=True) for n in box.names]
    for w in writers:
        w.start()
    procs = {name: RelayProcess(settings.replace(instance_id=name), tmp_path, name) for name in ("A", "B")}
    try:
        for p in procs.values():
            p.start()
        for kill in range(3):
            leader = wait_until(lambda: _leader(env, procs, box.names), 60, "a leader")
            time.sleep(rng.uniform(1.0, 3.0))
            procs[leader].kill()
            procs[leader] = RelayProcess(settings.replace(instance_id=leader), tmp_path, f"{leader}-{kill}").start()
        for w in writers:
            w.join()
        isolation = "read_committed"
        for name, w in written.items():
            def done(name=name, w=w):
                records = read_topic(env.servers.kafka_bootstrap, box.topic(name), isolation=isolation)
                return records if {r.id for r in records} >= w.ids else None

            records = wait_until(done, 240, f"every event of {name}", interval=2)
            verdict = assert_complete_and_ordered(records, w)
            if mode.get("delivery") == "exactly-once":
                assert not verdict.duplicates, f"{name}: read_committed sees each event once"
    finally:
        for w in writers:
            w.join(timeout=60)
        for p in procs.values():
            p.stop()

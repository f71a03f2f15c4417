"""A partitioned outbox (RELAY_PARTITIONS > 1) on real servers: the partition formula against
MongoDB, a group publishing through one lease per partition, the refusal to change the count
under running relays, and moving from one count to another without loss (docs/partitions.md)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request

from bson import Timestamp

from relay.commands.status import reset_checkpoint, status
from relay.core.partitions import Partition, Scope, hashed_index_key, partition_expression, partition_of
from relay.core.positions import token_cluster_time
from relay.dev.stack import free_port
from relay.mongo.lease import cluster_time
from relay.mongo.pipeline import pipeline
from tests.support.oracle import all_published, assert_complete_and_ordered
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, background_writes


def _aggregate_ids(rng: random.Random) -> list[str]:
    def text(alphabet_max: int) -> str:
        chars = []
        while len(chars) < rng.randint(0, 24):
            c = rng.randint(1, alphabet_max)
            if not 0xD800 <= c <= 0xDFFF:  # surrogates are not text
                chars.append(chr(c))
        return "".join(chars)
    return ["", "order-1", "string to hash", "ö€😀", "x" * 5000] + \
        [text(0x7F) for _ in range(150)] + [text(0x10FFFF) for _ in range(150)]


def test_partition_formula_matches_the_server_and_each_insert_reaches_exactly_its_partitions_stream(env):
    """`partition_of` (Python) against `$toHashedIndexKey` and `$mod` computed by mongod, for
    ASCII, any Unicode, empty, long, null and missing aggregate ids; then the partitions' change
    streams: each insert arrives on exactly one, the one the formula names, and a drop on all."""
    n = 4
    coll = env.outbox
    ids = _aggregate_ids(random.Random(11))
    docs = [{"_id": i, "aggregateId": a} for i, a in enumerate(ids)]
    docs += [{"_id": "null", "aggregateId": None}, {"_id": "missing"}]
    start = env.client.admin.command("hello")["lastWrite"]["opTime"]["ts"]
    coll.insert_many(docs)
    expected = {d["_id"]: partition_of(d.get("aggregateId"), n) for d in docs}
    server = {d["_id"]: d for d in coll.aggregate([{"$project": {
        "h": {"$toHashedIndexKey": "$aggregateId"}, "m": partition_expression("$aggregateId", n)}}])}
    for d in docs:
        got = server[d["_id"]]
        assert got["h"] == hashed_index_key(d.get("aggregateId")), d
        assert got["m"] % n == expected[d["_id"]], d
    assert {server[i]["m"] < 0 for i in expected} == {True, False}, "both signs of $mod were exercised"

    seen: dict[object, list[int]] = {}
    streams = [coll.watch(pipeline(Partition(k, n)), start_at_operation_time=start, max_await_time_ms=100)
               for k in range(n)]
    try:
        for k, stream in enumerate(streams):
            want = sum(1 for v in expected.values() if v == k)
            got: list[object] = []
            deadline = time.monotonic() + 60
            while len(got) < want and time.monotonic() < deadline:
                change = stream.try_next()
                if change is not None:
                    got.append(change["fullDocument"]["_id"])
            while (change := stream.try_next()) is not None:  # nothing more
                got.append(change["fullDocument"]["_id"])
            for i in got:
                seen.setdefault(i, []).append(k)
        assert seen == {i: [k] for i, k in expected.items()}
        coll.drop()
        for stream in streams:
            change = wait_until(stream.try_next, 30, "the drop on every partition's stream")
            assert change["operationType"] == "drop"
    finally:
        for stream in streams:
            stream.close()


def _leases(env, n: int) -> list[dict]:
    coll = env.db[env.settings.lease_collection]
    return [coll.find_one({"_id": Scope(env.namespace, Partition(k, n)).lease_id}) or {} for k in range(n)]


def test_a_group_publishes_every_event_in_order_through_one_lease_per_partition(env, logs):
    settings = env.settings.replace(partitions=3, http_port=free_port())
    written = Written()
    captured = logs("json")
    with RelayThread(settings) as relay:
        server = relay.relay.observer.serve()
        try:
            background_writes(env, written, 3000, writers=3).join()
            records = all_published(env, written)
            wait_until(lambda: all(d.get("resumeToken") for d in _leases(env, 3)), 30, "a checkpoint per partition")
            shown = status(settings)
            held = [relay.metric("relay_lease_held", partition=str(k)) for k in range(3)]
            led = relay.metric("relay_partitions_led")
            base = f"http://127.0.0.1:{settings.http_port}"
            ready = json.loads(urllib.request.urlopen(f"{base}/readyz", timeout=10).read())
            exposed = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
        finally:
            server.shutdown()
    lines = captured.lines()
    opened = sorted(x["partition"] for x in lines if x["message"].startswith("change stream opened"))
    assert opened == [0, 1, 2], "each partition's loop logs with its partition"
    outbox = str(settings.namespaces[0])
    assert ready == {"ok": True, "role": "leader", "reason": "leader",
                     "outboxes": {outbox: {"ok": True, "role": "leader"}}}
    held_lines = [line for line in exposed.splitlines() if line.startswith("relay_lease_held{")]
    assert sorted(held_lines) == sorted(f'relay_lease_held{{outbox="{outbox}",partition="{k}"}} 1.0'
                                        for k in range(3)), exposed
    verdict = assert_complete_and_ordered(records, written)
    assert held == [1, 1, 1] and led == 3, "one replica alone leads every partition"
    assert env.db[settings.lease_collection].find_one({"_id": str(settings.namespaces[0])}) is None, \
        "no unpartitioned lease document"
    assert [row["partition"] for row in shown["leases"]] == [0, 1, 2]
    assert {row["lease"]["owner"] for row in shown["leases"]} == {settings.instance_id}
    assert all(row["checkpoint"]["lagSeconds"] is not None for row in shown["leases"])
    assert shown["replicas"][0]["instance"] == settings.instance_id and shown["replicas"][0]["leading"] == [0, 1, 2]
    # Each partition's events came through its own lease: its fencing token in the header.
    fencing = {k: d["fencingToken"] for k, d in enumerate(_leases(env, 3))}
    assert all(r.fencing == fencing[partition_of(r.key, 3)] for r in records)
    assert shown["partitionsLed"] == 3
    stopped = _leases(env, 3)
    assert all(d["owner"] is None for d in stopped), "a graceful stop releases every partition"
    print(f"\ngroup of 3 partitions: {len(written.ids)} events, {len(verdict.duplicates)} duplicates")
    assert "checkpoint for" in reset_checkpoint(settings)
    assert not any(d.get("resumeToken") for d in _leases(env, 3)), "reset forgets every partition's checkpoint"


def _run(settings, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", "run"], env=settings_env(settings) | env_overrides,
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_changing_the_partition_count_is_refused_while_relays_of_another_count_hold_leases(env):
    settings = env.settings.replace(partitions=2)
    with RelayThread(settings):
        wait_until(lambda: all(d.get("owner") for d in _leases(env, 2)), 60, "both partitions led")
        for other in ("3", "1"):
            refused = _run(settings, RELAY_PARTITIONS=other, RELAY_INSTANCE_ID=f"new-{other}")
            assert refused.returncode == 2, refused.stderr
            line = refused.stderr.strip().splitlines()[-1]
            assert f"RELAY_PARTITIONS: {other}, but relays with RELAY_PARTITIONS=2 hold leases on " \
                   f"{settings.namespaces[0]}" in line, line
            assert settings.instance_id in line
    assert all(d.get("owner") is None for d in _leases(env, 2))


def test_moving_from_one_to_three_to_two_partitions_under_load_loses_nothing(env):
    """Stop every relay, start the new count: each move starts the new partitions at the oldest
    checkpoint of the old ones, so nothing is lost and the new partitions publish nothing before
    that point; fencing tokens keep growing; the old lease documents are gone.

    With three partitions, partition 0 is held by a stuck replica ("phantom") after its first
    checkpoint, so its events wait while the other two publish: its checkpoint is far behind
    theirs when the count changes to two, and starting anywhere after it would lose them."""
    written = Written()
    writer = background_writes(env, written, 9000, writers=3, pause=0.01)
    leases = env.db[env.settings.lease_collection]
    stuck = Scope(env.namespace, Partition(0, 3)).lease_id
    phases = []
    for count, share in ((1, 0.2), (3, 0.45), (2, 1.0)):
        settings = env.settings.replace(partitions=count, instance_id=f"n{count}")
        with RelayThread(settings) as relay:
            wait_until(lambda: relay.relay.observer.ready(), 60, f"the group of {count} started")
            docs = list(leases.find())
            assert sorted(d["_id"] for d in docs) == sorted(
                Scope(env.namespace, Partition(k, count)).lease_id for k in range(count)), "old documents removed"
            seeds = {d.get("startAtClusterTime") for d in docs}
            if count == 1:  # the unpartitioned document has the fields it had before partitions, no more
                # (but acquiredAt, which every lease holds since issue 42: `status` shows it, and the
                # clean-up record cleanedUpBefore, null from creation: replay reads it)
                wait_until(lambda: (leases.find_one() or {}).get("resumeToken"), 60, "the first checkpoint")
                assert set(leases.find_one()) <= {"_id", "owner", "fencingToken", "expiresAt", "renewedAt", "resumeToken",
                                                  "tokenClusterTime", "pipelineFingerprint", "checkpointAt",
                                                  "delivery", "acquiredAt", "cleanedUpBefore"}
            if count == 3:
                wait_until(lambda: (leases.find_one({"_id": stuck}) or {}).get("resumeToken"), 60,
                           "partition 0's first checkpoint")
                leases.update_one({"_id": stuck}, [{"$set": {
                    "owner": "phantom", "fencingToken": {"$add": ["$fencingToken", 1]},
                    "expiresAt": {"$add": ["$$NOW", 3_600_000]}}}])
            target = 9000 if share == 1.0 else int(9000 * share)
            wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= target, 120,
                       f"{target} messages")
            if share == 1.0:
                writer.join()
                records = all_published(env, written)
        if count == 3:
            behind = leases.find_one({"_id": stuck})["tokenClusterTime"]
            ahead = min(d["tokenClusterTime"] for d in leases.find({"_id": {"$ne": stuck}}))
            assert behind < ahead, "partition 0's checkpoint is behind the others"
            leases.update_one({"_id": stuck}, [{"$set": {"owner": None, "expiresAt": "$$NOW"}}])  # stopped too
        tokens = sorted({d["fencingToken"] for d in leases.find()})
        phases.append((count, seeds, tokens))
    verdict = assert_complete_and_ordered(records, written)
    (_, _, t1), (_, seeds3, t3), (_, seeds2, t2) = phases
    assert max(t1) < min(t3) and max(t3) < min(t2), f"fencing tokens grow across moves: {phases}"
    assert len(seeds3) == 1 and len(seeds2) == 1 and None not in seeds3 | seeds2, phases
    for seed, tokens in ((next(iter(seeds3)), t3), (next(iter(seeds2)), t2)):
        assert isinstance(seed, Timestamp)
        mine = [r for r in records if min(tokens) <= r.fencing <= max(tokens)]
        assert mine and all(token_cluster_time({"_data": r.position}) >= cluster_time(seed) for r in mine), \
            "the new partitions publish nothing before the oldest old checkpoint"
    print(f"\n1 -> 3 -> 2 partitions: {len(written.ids)} events, {len(verdict.duplicates)} duplicates, "
          f"fencing tokens {t1} -> {t3} -> {t2}")

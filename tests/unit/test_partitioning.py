"""Partitions without servers: the hash formula, lease ids, pipelines, and the balancing rule.

The formula is checked against MongoDB itself in tests/integration/test_partitions.py; here the
known value from MongoDB's manual, the properties the relay relies on, and the convergence of
the balancing rule (the real `relay.group.balance.Balance` for each replica over a simulated lease table)
under joins, graceful leaves and crashes; and the line a replica writes when it joins its group.
"""

from __future__ import annotations

import collections
import random

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from relay.config import Settings
from relay.core.errors import ConfigError
from relay.core.namespace import Namespace
from relay.core.partitions import (
    Partition,
    Scope,
    hashed_index_key,
    lease_id_pattern,
    parse_lease_id,
    partition_of,
)
from relay.group.balance import Balance, EveryLease, balance_for, targets
from relay.mongo.pipeline import PIPELINE, fingerprint, pipeline, pipeline_fingerprint, scan_filter

APP = Namespace("app", "outbox")


def test_hashed_index_key_matches_the_value_in_mongodbs_manual():
    # https://www.mongodb.com/docs/manual/reference/operator/aggregation/toHashedIndexKey/
    assert hashed_index_key("string to hash") == 763543691661428748


def test_partition_of_is_in_range_and_spreads_keys_evenly():
    keys = [f"order-{i}" for i in range(8000)]
    for n in (2, 3, 4, 8):
        counts = collections.Counter(partition_of(k, n) for k in keys)
        assert set(counts) == set(range(n))
        assert max(counts.values()) < 1.15 * len(keys) / n, counts
    assert partition_of(None, 4) == hashed_index_key(None) % 4


def test_one_partition_keeps_todays_lease_id_pipeline_and_fingerprint():
    """RELAY_PARTITIONS=1: the lease document, the pipeline and the stored fingerprint are those
    of earlier releases, so a running deployment upgrades without a checkpoint reset."""
    assert Scope(APP).lease_id == Scope(APP, Partition(0, 1)).lease_id == "app.outbox"
    assert pipeline(Partition(0, 1)) == PIPELINE
    assert scan_filter(Partition(0, 1)) is None
    assert pipeline_fingerprint(APP, pipeline(Partition(0, 1))) == "d225fb2ff19aa6b2"  # 0.1's fingerprint
    assert fingerprint(Scope(APP), "aggregateId") == "d225fb2ff19aa6b2"
    assert Settings().partitions == 1


def test_partition_pipelines_have_fingerprints_of_their_own():
    prints = {pipeline_fingerprint(APP, pipeline(Partition(k, n))) for n in (2, 3, 4) for k in range(n)}
    prints.add(pipeline_fingerprint(APP, pipeline(Partition(0, 1))))
    assert len(prints) == 1 + 2 + 3 + 4, "a token of one partitioning is never resumed by another"
    assert pipeline_fingerprint(APP, pipeline(Partition(1, 4), "aggId")) != \
        pipeline_fingerprint(APP, pipeline(Partition(1, 4)))


def test_partition_selection_matches_both_signs_of_mongodbs_mod():
    assert Partition(0, 4).selection("$a") == scan_filter(Partition(0, 4), "a") == \
        {"$expr": {"$in": [{"$mod": [{"$toHashedIndexKey": "$a"}, 4]}, [0]]}}
    assert Partition(3, 4).selection("$a")["$expr"]["$in"][1] == [3, -1]


def test_lease_ids_of_partitions_round_trip_and_stay_within_their_outbox():
    assert Scope(APP, Partition(2, 4)).lease_id == "app.outbox#2/4"
    assert parse_lease_id(APP, "app.outbox#2/4") == Partition(2, 4)
    assert parse_lease_id(APP, "app.outbox") == Partition(0, 1)
    for other in ("app.outbox2", "app.outbox#4/4", "app.outbox#1", "xapp.outbox", "app.outbox#1/4x"):
        assert parse_lease_id(APP, other) is None, other
    import re

    pattern = re.compile(lease_id_pattern(APP))
    assert pattern.match("app.outbox") and pattern.match("app.outbox#3/8")
    assert not pattern.match("app.outbox2") and not pattern.match("appXoutbox")


def test_partitions_setting_is_validated():
    with pytest.raises(ConfigError, match="RELAY_PARTITIONS: must be between 1 and 64"):
        Settings.load(env={"RELAY_PARTITIONS": "0"})
    with pytest.raises(ConfigError, match="RELAY_PARTITIONS: must be an integer"):
        Settings.load(env={"RELAY_PARTITIONS": "four"})
    assert Settings.load(env={"RELAY_PARTITIONS": "4"}).partitions == 4
    with pytest.raises(ConfigError, match="RELAY_STANDBY_POLL_S: must be at most half of RELAY_LEASE_TTL_S"):
        Settings.load(env={"RELAY_PARTITIONS": "4", "RELAY_STANDBY_POLL_S": "20"})


@pytest.mark.parametrize("live, n, expected", [
    (["a"], 4, {"a": 4}),
    (["b", "a", "c"], 6, {"a": 2, "b": 2, "c": 2}),
    (["c", "b", "a"], 4, {"a": 2, "b": 1, "c": 1}),
    (["a", "b", "c", "d", "e"], 3, {"a": 1, "b": 1, "c": 1, "d": 0, "e": 0}),
])
def test_targets_add_up_to_the_partitions_and_differ_by_at_most_one(live, n, expected):
    assert targets(live, n) == expected
    assert targets(reversed(live), n) == expected, "every replica computes the same targets"


def test_a_replica_counts_itself_before_its_heartbeat_is_visible():
    b = balance_for(6, partitions=2)
    assert b.rebalance("b", ["a"]) and b.target == 3
    assert not b.rebalance("b", ["a", "b"]), "the same share: no change"


def test_without_partitions_every_replica_may_lead_every_lease_and_hands_none_over():
    every = balance_for(3, partitions=1)
    assert isinstance(every, EveryLease)
    assert not every.rebalance("b", ["a", "c"]) and every.target == 3
    assert all(every.may_lead(k) for k in range(3)) and all(every.may_lead(k) for k in range(3))
    for k in range(3):
        every.led(k, True)
    assert not any(every.hand_over(k) for k in range(3))
    assert every.leading() == [0, 1, 2], "what is held still goes into the group's heartbeat"


def test_balance_counts_attempts_against_the_target_and_hands_over_one_above_it():
    b = Balance(4)
    b.rebalance("b", ["a"])  # 2 of 4
    assert b.may_lead(0) and b.may_lead(1) and not b.may_lead(2), "two attempts at once at most"
    b.led(0, False)  # partition 0 was held elsewhere
    assert b.may_lead(2)
    b.led(1, True)
    b.led(2, True)
    assert b.may_lead(1), "a held partition is always tried again (a restarting leader)"
    assert not b.hand_over(1)
    b.rebalance("c", ["a", "b"])  # 1 of 4: a gets 2, b and c 1
    assert b.target == 1
    assert b.hand_over(2) and not b.hand_over(1), "one hand-over at a time"
    assert b.leading() == [1, 2]
    b.led(2, False)
    assert b.leading() == [1] and not b.may_lead(2)


# ---- the balancing rule converges -----------------------------------------------------------------

class BalancingMachine(RuleBasedStateMachine):
    """Replicas, each with the real `Balance`, share N partitions through a lease table; each
    partition's relay acts as `Relay.turn` does (a standby asks `may_lead` and tries the lease; a
    leader asks `hand_over` and releases). Replicas join, leave gracefully and crash (their
    leases expire after a while, when the others also stop counting them). After the faults,
    within a few rounds, every partition is led and every replica leads exactly its target. With
    one partition there is nothing to share: a leader is never asked to hand it over."""

    @initialize(n=st.integers(1, 9), replicas=st.integers(1, 4), seed=st.integers(0, 2**16))
    def start(self, n: int, replicas: int, seed: int) -> None:
        self.n = n
        self.rng = random.Random(seed)
        self.owner: list[str | None] = [None] * n
        self.replicas: dict[str, Balance] = {}
        self.dead: dict[str, int] = {}  # crashed replica -> rounds until its leases expire
        self.names = 0
        for _ in range(replicas):
            self.join()

    def _name(self) -> str:
        self.names += 1
        return f"r{self.names:02d}"

    def _round(self) -> None:
        for name, dead_for in list(self.dead.items()):  # leases of crashed replicas expire
            if dead_for <= 1:
                del self.dead[name]
                self.owner = [None if o == name else o for o in self.owner]
            else:
                self.dead[name] = dead_for - 1
        live = sorted([*self.replicas, *self.dead])  # the crashed count until their leases expire
        for name, balance in self.replicas.items():
            balance.rebalance(name, live)
        turns = [(name, k) for name in self.replicas for k in range(self.n)]
        self.rng.shuffle(turns)
        for name, k in turns:
            balance = self.replicas[name]
            if self.owner[k] == name:
                if balance.hand_over(k):
                    assert self.n > 1, "a replica handed over the only partition"
                    self.owner[k] = None
                    balance.led(k, False)
            elif balance.may_lead(k):
                free = self.owner[k] is None
                if free:
                    self.owner[k] = name
                balance.led(k, free)

    @rule()
    def join(self) -> None:
        self.replicas[self._name()] = balance_for(self.n, self.n)

    @rule()
    def leave(self) -> None:
        if len(self.replicas) > 1:
            name = self.rng.choice(sorted(self.replicas))
            del self.replicas[name]
            self.owner = [None if o == name else o for o in self.owner]

    @rule(rounds=st.integers(1, 3))
    def crash(self, rounds: int) -> None:
        if len(self.replicas) > 1:
            name = self.rng.choice(sorted(self.replicas))
            del self.replicas[name]
            self.dead[name] = rounds

    @rule(rounds=st.integers(1, 3))
    def rounds(self, rounds: int) -> None:
        for _ in range(rounds):
            self._round()

    @invariant()
    def leaders_are_known_replicas(self) -> None:
        assert all(o is None or o in self.replicas or o in self.dead for o in self.owner)

    def teardown(self) -> None:
        if not hasattr(self, "n"):
            return
        for _ in range(4 + 3):  # crashed leases expire within 3 rounds; then it settles
            self._round()
        assert None not in self.owner, f"partitions not led: {self.owner}"
        if self.n == 1:
            return  # one leader, whichever took the lease first (relay.group.balance)
        want = targets(self.replicas, self.n)
        held = collections.Counter(self.owner)
        assert {r: held.get(r, 0) for r in self.replicas} == want, (held, want)


TestBalancingMachine = BalancingMachine.TestCase
TestBalancingMachine.settings = hsettings(max_examples=200, stateful_step_count=25, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])


def test_the_joined_line_says_the_partition_count_in_words_that_fit_it():
    from relay.core.config import LeaseTiming
    from relay.group.config import GroupConfig

    timing = LeaseTiming(lease_ttl_s=30.0, heartbeat_interval_s=5.0, standby_poll_s=2.0)

    def joined(outboxes: tuple[Namespace, ...], partitions: int) -> str:
        return GroupConfig(instance_id="r1", partitions=partitions, timing=timing).joined(outboxes)

    assert joined((APP,), 1) == "relay r1 in the group of app.outbox"
    assert joined((APP,), 4) == "relay r1 in the group of app.outbox (4 partitions)"
    assert joined((Namespace("b", "outbox"), Namespace("a", "outbox")), 4) == \
        "relay r1 in the group of a.outbox,b.outbox (4 partitions each)"

"""Catch-up on equal terms: every contestant on a backlog written for it just before it starts.

A change stream started at a backlog reads past everything written after it, so a contestant run
after others (their backlogs, their output) pays for their writes: earlier runs of this benchmark
put the peers last, and mongod spent 87-214 µs per event serving them against 19-29 µs when they
ran early. Here, for each of `rounds` rounds, in an order rotated by one each round:

1. write a fresh backlog of the variant in a database of its own (nothing is written after it);
2. wait until mongod and the broker are idle (their CPU, measured with psutil over 1 s, below
   IDLE_CORES; not a fixed sleep) and record how idle they were;
3. run the contestant, then drop its database.

The report gives each contestant's median and range, ratios of medians, and flags a contestant
whose mongod CPU per event differs by more than 1.5x from the relay's (a sign of unequal terms).
"""

from __future__ import annotations

import math
import statistics
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient

from bench.common import Row, progress
from bench.events import Variant
from bench.relay_under_test import relay_settings
from bench.sampling import wait_idle
from bench.scenarios.backlog import Backlog, write_backlog
from bench.scenarios.bare_relay import bare_relay
from bench.scenarios.catch_up import relay_catch_up
from bench.scenarios.change_stream import bare_change_stream
from bench.scenarios.exactly_once import exactly_once_catch_up
from bench.scenarios.peers import connect_peer, connect_specs, peer_catch_up
from relay.dev.stack import LocalStack

UNEQUAL_MONGOD = 1.5

RELAY = "relay"
Runner = Callable[[Backlog, str], Row]


@dataclass
class Contestant:
    name: str
    run: Runner
    rows: list[Row] = field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        return [r.events_per_s for r in self.rows if not r.error and r.events_per_s > 0]

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else math.nan

    def median_of(self, attr: str) -> float:
        values = [getattr(r, attr) for r in self.rows if not r.error and not math.isnan(getattr(r, attr))]
        return statistics.median(values) if values else math.nan


def contestants(stack: LocalStack, client: MongoClient[Any], jars: Any, jars_error: str | None,
                peers: bool, exactly_once: bool) -> list[Contestant]:
    """The relay, its exactly-once mode, the two bare baselines, and each Kafka Connect peer at
    its defaults and tuned by its documentation (bench.peers.connect.tuned)."""
    from bench.peers.connect import tuned

    def relay(b: Backlog, rid: str) -> Row:
        return relay_catch_up(stack, client, b, rid)

    def eos(b: Backlog, rid: str) -> Row:
        return exactly_once_catch_up(stack, client, b, rid)

    def bare(b: Backlog, rid: str) -> Row:
        settings = relay_settings(stack, b.database, "unused", "now")
        return bare_relay(stack, client, b, settings, f"bench.{rid}.bare-relay")

    def stream(b: Backlog, rid: str) -> Row:
        return bare_change_stream(stack, client, b)

    def cleaning(b: Backlog, rid: str) -> Row:
        # Clean-up by position as tight as it goes: every covered document, checked every second.
        env = {"RELAY_OUTBOX_RETENTION": "0", "RELAY_OUTBOX_CHECK_INTERVAL_S": "1"}
        return relay_catch_up(stack, client, b, rid, label="relay + clean-up", env=env)

    out = [Contestant(RELAY, relay), Contestant("relay + clean-up (RELAY_OUTBOX_RETENTION=0)", cleaning)]
    if exactly_once:
        out.append(Contestant("relay, exactly-once", eos))
    out += [Contestant("baseline: bare relay", bare), Contestant("baseline: bare change stream", stream)]
    if peers:
        for index, label in ((1, "MongoDB connector"), (0, "Debezium")):
            for tune in (False, True):

                def peer(b: Backlog, rid: str, index: int = index, tune: bool = tune) -> Row:
                    spec = connect_specs(stack, b, rid)[index]
                    spec = tuned(spec) if tune else spec
                    return peer_catch_up(stack, b, connect_peer(spec, jars, jars_error, stack.kafka.bootstrap_servers))

                out.append(Contestant(f"peer: {label}" + (" (tuned)" if tune else ""), peer))
    return out


def relay_and_bare(stack: LocalStack, client: MongoClient[Any]) -> list[Contestant]:
    """The relay and its bare relay: the payload variants' pair on equal terms."""
    return [c for c in contestants(stack, client, None, None, peers=False, exactly_once=False)
            if c.name in (RELAY, "baseline: bare relay")]


def fair_catch_up(stack: LocalStack, client: MongoClient[Any], variant: Variant, run_id: str, rounds: int,
                  entrants: list[Contestant]) -> list[Contestant]:
    """Run every contestant `rounds` times on equal terms (see the module docstring); none when
    `--skip-contestants` left none."""
    for r in range(rounds if entrants else 0):
        order = entrants[r % len(entrants):] + entrants[:r % len(entrants)]
        for c in order:
            database = f"fair_{run_id}_{uuid.uuid4().hex[:6]}"
            progress(f"[equal terms, round {r + 1}/{rounds}] {c.name}: writing a backlog of {variant.events:,}")
            backlog = write_backlog(client, database, variant)
            idle = wait_idle(stack)
            row = c.run(backlog, f"{run_id}r{r}{uuid.uuid4().hex[:4]}")
            row.extra["idle_cores_before"] = idle
            row.extra["round"] = r
            c.rows.append(row)
            progress(f"  {c.name}: {row.events_per_s:,.0f} events/s" + (f" FAILED {row.error}" if row.error else ""))
            client.drop_database(database)
    return entrants


def format_fair(entrants: list[Contestant], rounds: int, events: int) -> list[str]:
    relay = next((c for c in entrants if c.name == RELAY), None)
    if relay is None or not relay.rates:
        return []
    mongod_relay = relay.median_of("mongod_cpu_us_per_event")
    lines = [f"catch-up on equal terms: {rounds} rounds, rotated order, each contestant on a fresh backlog of "
             f"{events:,} events written just before it, servers idle first (medians; range in brackets)",
             f"{'contestant':<36} {'events/s':>9} {'range':>17} {'relay/it':>9} {'CPU µs/ev':>10} "
             f"{'mongod µs/ev':>13} {'RSS MB':>7}  terms"]
    for c in entrants:
        if not c.rates:
            errors = "; ".join(r.error or "" for r in c.rows)[:300]
            lines.append(f"{c.name:<36} FAILED: {errors}")
            continue
        mongod = c.median_of("mongod_cpu_us_per_event")
        unequal = mongod_relay > 0 and (mongod / mongod_relay > UNEQUAL_MONGOD or mongod_relay / mongod > UNEQUAL_MONGOD)
        lines.append(f"{c.name:<36} {c.median:>9,.0f} {f'({min(c.rates):,.0f}-{max(c.rates):,.0f})':>17} "
                     f"{relay.median / c.median:>9.2f} {c.median_of('cpu_us_per_event'):>10.0f} {mongod:>13.0f} "
                     f"{c.median_of('peak_rss_mb'):>7.0f}  "
                     + (f"UNEQUAL? mongod/event {mongod / mongod_relay:.2f}x the relay's" if unequal else "equal"))
    lines.append("  relay/it = median / median. A peer's CPU counts from its connector's start (its JVM start-up "
                 "excluded), over the interval its rate covers.")
    return lines

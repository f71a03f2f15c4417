"""Catch-up on equal terms: every contestant in its own process, on a backlog written for it just
before it starts, sized so that each drains for at least `drain_s` seconds on the machine at hand.

A change stream started at a backlog reads past everything written after it, so a contestant run
after others (their backlogs, their output) pays for their writes: earlier runs of this benchmark
put the peers last, and mongod spent 87-214 µs per event serving them against 19-29 µs when they
ran early. A backlog that drains in 3 s measures start-up and JIT warm-up more than draining, so
its size comes from a calibration: the probe contestants (PROBES, those in the field) each drain a
probe backlog of `probe_events`, and the backlog is the fastest probe's rate x `drain_s` x MARGIN,
rounded up to STEP events (`backlog_events`). Every contestant of a round gets the same size; a
round in which someone still drained for less than `drain_s` sizes the next by its own fastest
rate (`next_backlog`), and the table marks those rows "short". Then, for each of `rounds` rounds,
in an order rotated by one each round (`rotated`):

1. write a fresh backlog of that size in a database of its own (nothing is written after it);
2. wait until mongod and the broker are idle (their CPU, measured with psutil over 1 s, below
   IDLE_CORES; not a fixed sleep) and record how idle they were;
3. run the contestant as a process of its own, timed from its first delivered event to its last
   (bench.scenarios.drain: the same clock and rule for all; start-up reported apart), then drop
   its database.

The report gives each contestant's median and range, ratios of medians, and flags a contestant
whose mongod CPU per event differs by more than 1.5x from the relay's (a sign of unequal terms).
"""

from __future__ import annotations

import math
import statistics
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
MARGIN = 1.2               # the fastest probe drains for drain_s x MARGIN
STEP = 1000                # backlog sizes are rounded up to this
PROBES = ("relay", "baseline: bare change stream", "baseline: bare relay")

RELAY = "relay"
T = TypeVar("T")
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


def rotated(entrants: Sequence[T], r: int) -> list[T]:
    """Round `r`'s order: the field rotated left by `r` (every contestant goes first once in n rounds)."""
    k = r % len(entrants) if entrants else 0
    return [*entrants[k:], *entrants[:k]]


def backlog_events(rates: list[float], drain_s: float, margin: float = MARGIN, step: int = STEP) -> int:
    """The backlog the fastest of `rates` (events/s) drains in `drain_s` x `margin` seconds, rounded
    up to `step` (at least one step). Rates that are not positive numbers are left out."""
    usable = [r for r in rates if r > 0 and math.isfinite(r)]
    if not usable:
        raise ValueError("no rate to size a backlog by")
    return max(step, math.ceil(max(usable) * drain_s * margin / step) * step)


def next_backlog(events: int, rows: list[Row], drain_s: float) -> int:
    """The next round's backlog: `events` again, unless a row of this round drained for less than
    `drain_s` seconds; then sized by the fastest rate of the round (never smaller)."""
    measured = [r for r in rows if not r.error and r.events_per_s > 0]
    if not any(r.seconds < drain_s for r in measured):
        return events
    return max(events, backlog_events([r.events_per_s for r in measured], drain_s))


def calibrate(client: MongoClient[Any], variant: Variant, run_id: str, entrants: list[Contestant], drain_s: float,
              probe_events: int, stack: LocalStack) -> tuple[int, list[Row]]:
    """The backlog size of round 1 (module docstring), and the probes' rows (reported, not counted)."""
    probes = [c for c in entrants if c.name in PROBES] or entrants[:1]
    rows = []
    for c in probes:
        progress(f"[equal terms, calibration] {c.name} on a probe backlog of {probe_events:,}")
        rows.append(_one(stack, client, variant, probe_events, c, f"{run_id}cal{uuid.uuid4().hex[:4]}"))
    rates = [r.events_per_s for r in rows if not r.error]
    return (backlog_events(rates, drain_s) if rates else probe_events), rows


def _one(stack: LocalStack, client: MongoClient[Any], variant: Variant, events: int, c: Contestant,
         rid: str) -> Row:
    """`c` on a fresh backlog of `events`, the servers idle first; its database dropped after."""
    database = f"fair_{rid}_{uuid.uuid4().hex[:6]}"
    backlog = write_backlog(client, database, variant, events)
    idle = wait_idle(stack)
    try:
        row = c.run(backlog, rid)
    finally:
        client.drop_database(database)
    row.extra["idle_cores_before"] = idle
    row.extra["backlog_events"] = events
    return row


@dataclass
class Field:
    """A catch-up on equal terms: its contestants, the backlog of each round and the calibration."""

    entrants: list[Contestant]
    drain_s: float
    backlogs: list[int] = field(default_factory=list)
    calibration: list[Row] = field(default_factory=list)


def fair_catch_up(stack: LocalStack, client: MongoClient[Any], variant: Variant, run_id: str, rounds: int,
                  entrants: list[Contestant], drain_s: float, probe_events: int) -> Field:
    """Run every contestant `rounds` times on equal terms (see the module docstring); none when
    `--skip-contestants` left none."""
    out = Field(entrants, drain_s)
    if not entrants or not rounds:
        return out
    events, out.calibration = calibrate(client, variant, run_id, entrants, drain_s, probe_events, stack)
    for r in range(rounds):
        out.backlogs.append(events)
        this_round = []
        for c in rotated(entrants, r):
            progress(f"[equal terms, round {r + 1}/{rounds}] {c.name}: a backlog of {events:,}")
            row = _one(stack, client, variant, events, c, f"{run_id}r{r}{uuid.uuid4().hex[:4]}")
            row.extra["round"] = r
            c.rows.append(row)
            this_round.append(row)
            progress(f"  {c.name}: {row.events_per_s:,.0f} events/s over {row.seconds:.1f} s"
                     + (f" FAILED {row.error}" if row.error else ""))
        events = next_backlog(events, this_round, drain_s)
    return out


def format_fair(f: Field, rounds: int) -> list[str]:
    entrants = f.entrants
    relay = next((c for c in entrants if c.name == RELAY), None)
    if relay is None or not relay.rates:
        return []
    mongod_relay = relay.median_of("mongod_cpu_us_per_event")
    probes = ", ".join(f"{r.scenario} {r.events_per_s:,.0f}/s" for r in f.calibration if not r.error)
    lines = [f"catch-up on equal terms: {rounds} rounds, rotated order, every contestant its own process on a fresh "
             f"backlog written just before it, servers idle first; backlogs {', '.join(f'{n:,}' for n in f.backlogs)} "
             f"events, sized for >= {f.drain_s:g} s of draining (calibration: {probes}); timed from the first "
             "delivered event to the last (medians; range in brackets)",
             f"{'contestant':<36} {'events/s':>9} {'range':>17} {'relay/it':>9} {'drain s':>8} {'start s':>8} "
             f"{'CPU µs/ev':>10} {'mongod µs/ev':>13} {'RSS MB':>7}  terms"]
    for c in entrants:
        if not c.rates:
            errors = "; ".join(r.error or "" for r in c.rows)[:300]
            lines.append(f"{c.name:<36} FAILED: {errors}")
            continue
        mongod = c.median_of("mongod_cpu_us_per_event")
        unequal = mongod_relay > 0 and (mongod / mongod_relay > UNEQUAL_MONGOD or mongod_relay / mongod > UNEQUAL_MONGOD)
        short = sum(1 for r in c.rows if not r.error and r.seconds < f.drain_s)
        starts = [r.extra["start_up_s"] for r in c.rows if not r.error and "start_up_s" in r.extra]
        terms = f"UNEQUAL? mongod/event {mongod / mongod_relay:.2f}x the relay's" if unequal else "equal"
        terms += f"; SHORT: {short} round(s) under {f.drain_s:g} s" if short else ""
        lines.append(f"{c.name:<36} {c.median:>9,.0f} {f'({min(c.rates):,.0f}-{max(c.rates):,.0f})':>17} "
                     f"{relay.median / c.median:>9.2f} {c.median_of('seconds'):>8.1f} "
                     f"{statistics.median(starts) if starts else math.nan:>8.1f} {c.median_of('cpu_us_per_event'):>10.0f} "
                     f"{mongod:>13.0f} {c.median_of('peak_rss_mb'):>7.0f}  {terms}")
    lines.append("  relay/it = median / median. drain = first delivered event to the last (topic append times; the "
                 "bare stream's own clock); start = launch to first event, not in the rate. CPU µs/ev = the "
                 "contestant's process from its first event on (a peer's from its connector's start, JVM start-up "
                 "excluded).")
    return lines

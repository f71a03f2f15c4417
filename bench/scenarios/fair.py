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

The NATS JetStream field (issue 51, `nats_contestants`, `nats_field`) runs the same way with its own
calibration: the relay to NATS in both modes, the bare relay to NATS and the relay to Kafka as the
reference of the same rounds, compared with the relay to NATS, with nats-server's CPU per event.
The RabbitMQ field (issue 53, `rabbitmq_contestants`, `rabbitmq_field`) likewise: the relay to
RabbitMQ (at-least-once, its only mode), the bare relay to RabbitMQ and the relay to Kafka as the
reference, compared with the relay to RabbitMQ, with the RabbitMQ node's CPU per event.
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


NATS_RELAY = "relay to NATS"
NATS_PROBES = (NATS_RELAY, "baseline: bare relay to NATS", "relay to Kafka (reference)")


def nats_contestants(stack: LocalStack, client: MongoClient[Any], exactly_once: bool = True,
                     kafka_reference: bool = True) -> list[Contestant]:
    """The NATS JetStream field (issue 51): the relay to NATS (RELAY_BROKER=nats) in both delivery
    modes, the bare relay to NATS (bench.scenarios.bare_nats), and the relay to Kafka as the
    reference of the same rounds; each into a topic or stream of its own."""
    from bench.scenarios.bare_nats import bare_nats_relay

    def relay(b: Backlog, rid: str) -> Row:
        return relay_catch_up(stack, client, b, rid, label="relay to NATS (to checkpoint)", broker="nats")

    def eos(b: Backlog, rid: str) -> Row:
        return relay_catch_up(stack, client, b, rid, label="relay to NATS, exactly-once (to checkpoint)",
                              delivery="exactly-once", broker="nats")

    def bare(b: Backlog, rid: str) -> Row:
        settings = relay_settings(stack, b.database, "unused", "now")
        return bare_nats_relay(stack, client, b, settings, rid)

    def kafka(b: Backlog, rid: str) -> Row:
        return relay_catch_up(stack, client, b, rid)

    out = [Contestant(NATS_RELAY, relay)]
    if exactly_once:
        out.append(Contestant("relay to NATS, exactly-once", eos))
    out.append(Contestant("baseline: bare relay to NATS", bare))
    if kafka_reference:
        out.append(Contestant("relay to Kafka (reference)", kafka))
    return out


RABBITMQ_RELAY = "relay to RabbitMQ"
RABBITMQ_PROBES = (RABBITMQ_RELAY, "baseline: bare relay to RabbitMQ", "relay to Kafka (reference)")


def rabbitmq_contestants(stack: LocalStack, client: MongoClient[Any], kafka_reference: bool = True) -> list[Contestant]:
    """The RabbitMQ field (issue 53): the relay to RabbitMQ (RELAY_BROKER=rabbitmq), the bare relay to
    RabbitMQ (bench.scenarios.bare_rabbitmq), and the relay to Kafka as the reference of the same
    rounds; each into a topic, or an exchange and quorum queue, of its own."""
    from bench.scenarios.bare_rabbitmq import bare_rabbitmq_relay

    def relay(b: Backlog, rid: str) -> Row:
        return relay_catch_up(stack, client, b, rid, label="relay to RabbitMQ (to checkpoint)", broker="rabbitmq")

    def bare(b: Backlog, rid: str) -> Row:
        settings = relay_settings(stack, b.database, "unused", "now")
        return bare_rabbitmq_relay(stack, client, b, settings, rid)

    def kafka(b: Backlog, rid: str) -> Row:
        return relay_catch_up(stack, client, b, rid)

    out = [Contestant(RABBITMQ_RELAY, relay), Contestant("baseline: bare relay to RabbitMQ", bare)]
    if kafka_reference:
        out.append(Contestant("relay to Kafka (reference)", kafka))
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
              probe_events: int, stack: LocalStack, names: Sequence[str] = PROBES) -> tuple[int, list[Row]]:
    """The backlog size of round 1 (module docstring), and the probes' rows (reported, not counted);
    the probes are the entrants named in `names` (none of them: the first entrant)."""
    probes = [c for c in entrants if c.name in names] or entrants[:1]
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


KAFKA_CLOCK = "topic append times; the bare stream's own clock"
NATS_CLOCK = "JetStream's stored times for NATS, topic append times for Kafka"


@dataclass
class Field:
    """A catch-up on equal terms: its contestants, the backlog of each round and the calibration.
    `reference` names the contestant the others are compared with (`relay/it`), `probes` those the
    calibration runs, `clock` what the drain times are read from, `broker_role` the Sampler role of
    a broker whose CPU per event gets a column of its own ("nats"), `title` what the table is of."""

    entrants: list[Contestant]
    drain_s: float
    backlogs: list[int] = field(default_factory=list)
    calibration: list[Row] = field(default_factory=list)
    reference: str = RELAY
    probes: tuple[str, ...] = PROBES
    clock: str = KAFKA_CLOCK
    broker_role: str | None = None
    title: str = "catch-up on equal terms"


def nats_field(entrants: list[Contestant], drain_s: float) -> Field:
    """The NATS JetStream field's table settings (issue 51): compared with the relay to NATS."""
    return Field(entrants, drain_s, reference=NATS_RELAY, probes=NATS_PROBES, clock=NATS_CLOCK, broker_role="nats",
                 title="NATS JetStream (issue 51): catch-up on equal terms")


RABBITMQ_CLOCK = "the queue's depth, polled every 20 ms, for RabbitMQ; topic append times for Kafka"


def rabbitmq_field(entrants: list[Contestant], drain_s: float) -> Field:
    """The RabbitMQ field's table settings (issue 53): compared with the relay to RabbitMQ."""
    return Field(entrants, drain_s, reference=RABBITMQ_RELAY, probes=RABBITMQ_PROBES, clock=RABBITMQ_CLOCK,
                 broker_role="rabbitmq", title="RabbitMQ (issue 53): catch-up on equal terms")


def fair_catch_up(stack: LocalStack, client: MongoClient[Any], variant: Variant, run_id: str, rounds: int,
                  entrants: list[Contestant] | Field, drain_s: float, probe_events: int) -> Field:
    """Run every contestant `rounds` times on equal terms (see the module docstring); none when
    `--skip-contestants` left none. `entrants` may come as a Field already (its table settings)."""
    out = entrants if isinstance(entrants, Field) else Field(entrants, drain_s)
    entrants = out.entrants
    if not entrants or not rounds:
        return out
    events, out.calibration = calibrate(client, variant, run_id, entrants, drain_s, probe_events, stack, out.probes)
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
    if not any(c.rows for c in entrants):
        return []
    relay = next((c for c in entrants if c.name == f.reference and c.rates), None)
    reference_median = relay.median if relay is not None else math.nan  # failed or left out: no ratios
    mongod_relay = relay.median_of("mongod_cpu_us_per_event") if relay is not None else math.nan
    probes = ", ".join(f"{r.scenario} {r.events_per_s:,.0f}/s" for r in f.calibration if not r.error)
    broker = f.broker_role
    width = max(12, len(broker or "") + 6)
    broker_head = f" {(broker or '') + ' µs/ev':>{width}}" if broker else ""
    lines = [f"{f.title}: {rounds} rounds, rotated order, every contestant its own process on a fresh "
             f"backlog written just before it, servers idle first; backlogs {', '.join(f'{n:,}' for n in f.backlogs)} "
             f"events, sized for >= {f.drain_s:g} s of draining (calibration: {probes}); timed from the first "
             "delivered event to the last (medians; range in brackets)",
             f"{'contestant':<36} {'events/s':>9} {'range':>17} {'relay/it':>9} {'drain s':>8} {'start s':>8} "
             f"{'CPU µs/ev':>10} {'mongod µs/ev':>13}{broker_head} {'RSS MB':>7}  terms"]
    for c in entrants:
        if not c.rates:
            errors = "; ".join(r.error or "" for r in c.rows)[:300]
            lines.append(f"{c.name:<36} FAILED: {errors}")
            continue
        mongod = c.median_of("mongod_cpu_us_per_event")
        unequal = mongod_relay > 0 and (mongod / mongod_relay > UNEQUAL_MONGOD or mongod_relay / mongod > UNEQUAL_MONGOD)
        short = sum(1 for r in c.rows if not r.error and r.seconds < f.drain_s)
        starts = [r.extra["start_up_s"] for r in c.rows if not r.error and "start_up_s" in r.extra]
        whose = "the relay's" if f.reference == RELAY else "the reference's"
        terms = f"UNEQUAL? mongod/event {mongod / mongod_relay:.2f}x {whose}" if unequal else "equal"
        terms += f"; SHORT: {short} round(s) under {f.drain_s:g} s" if short else ""
        broker_cell = f" {_extra_median(c, f'{broker}_cpu_us_per_event'):>{width}.0f}" if broker else ""
        lines.append(f"{c.name:<36} {c.median:>9,.0f} {f'({min(c.rates):,.0f}-{max(c.rates):,.0f})':>17} "
                     f"{reference_median / c.median:>9.2f} {c.median_of('seconds'):>8.1f} "
                     f"{statistics.median(starts) if starts else math.nan:>8.1f} {c.median_of('cpu_us_per_event'):>10.0f} "
                     f"{mongod:>13.0f}{broker_cell} {c.median_of('peak_rss_mb'):>7.0f}  {terms}")
    ratio = "median / median" if f.reference == RELAY else f"the median of {f.reference} / its median"
    lines.append(f"  relay/it = {ratio}. drain = first delivered event to the "
                 f"last ({f.clock}); start = launch to first event, not in the rate. CPU µs/ev = the "
                 "contestant's process from its first event on (a peer's from its connector's start, JVM start-up "
                 "excluded)." + (f" {broker} µs/ev = the {broker} server's CPU per event during the contestant's run."
                                 if broker else ""))
    return lines


def _extra_median(c: Contestant, key: str) -> float:
    values = [r.extra[key] for r in c.rows if not r.error and isinstance(r.extra.get(key), float)
              and not math.isnan(r.extra[key])]
    return statistics.median(values) if values else math.nan

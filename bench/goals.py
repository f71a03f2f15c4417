"""The performance goals (issues 37, 45, 51 and 53) as `bench.run` reports them: measured values, met or
missed, never asserted. Ratios come from medians on equal terms where the run has them (the rotated
rounds of scenarios/fair.py and scenarios/steady.py), else from the single samples.

Issue 45's catch-up goals, on the fair harness: the relay at least 2x the tuned MongoDB connector
and 3x tuned Debezium, at least 0.9 of the bare change stream; exactly-once at least 0.95 of
at-least-once; every payload at least 0.9 of its bare relay; peak RSS under 100 MB through
1,000,000 events.

Issue 51's, on NATS JetStream: the relay to NATS at least 0.9 of the bare relay to NATS, in
both delivery modes (medians of the NATS field on equal terms); its p99 at each latency step beside
the relay on Kafka's, and CPU per event beside it, reported with no target.

Issue 53's, on RabbitMQ: the relay to RabbitMQ at least 0.9 of the bare relay to RabbitMQ (medians
of the RabbitMQ field on equal terms); its p99 at each latency step beside the relay on Kafka's and
to NATS's, CPU per event beside the relay to Kafka's, reported with no target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.common import COMPARED, ratio

TITLE = "goals (issues 37, 45, 51 and 53; reported, never asserted)"
Goal = Callable[..., None]


def goals(report: Any) -> list[dict[str, Any]]:
    """Every goal the run measured (`report`: bench.report.Report), in the order of issue 37."""
    out: list[dict[str, Any]] = []

    def goal(what: str, value: float, target: float, higher_is_better: bool = True, unit: str = "x") -> None:
        met = None if math.isnan(value) else (value >= target if higher_is_better else value <= target)
        out.append({"goal": what, "value": value, "target": target, "unit": unit, "met": met,
                    "higher_is_better": higher_is_better})

    if report.fair:
        _equal_terms(report.fair, goal, out)
    elif report.rows:
        _single_samples(report, goal)
    nats_field = getattr(report, "nats_fair", None)
    if nats_field is not None:
        _nats(nats_field.entrants, goal, out)
    rabbitmq_field = getattr(report, "rabbitmq_fair", None)
    if rabbitmq_field is not None:
        _rabbitmq(rabbitmq_field.entrants, goal, out)
    _variants(report, goal)
    _latency(report.summaries(), goal)
    _p99_beside(report.summaries(), out, "NATS", "relay to NATS")
    _p99_beside(report.summaries(), out, "RabbitMQ", "relay to RabbitMQ", (("relay to NATS", "to NATS"),))
    long_relay = next((r for r in report.long_run if r.kind == "relay"), None)
    if long_relay is not None:
        goal(f"peak RSS through a {long_relay.events:,}-event backlog", long_relay.peak_rss_mb, 100.0, False, "MB")
    if report.inbox:
        goal("inbox / bare batched consumer (the 10x over one transaction per event is retired)",
             report.inbox.get("inbox_vs_batched", math.nan), 0.9)
    return out


def _median_of(entrants: list[Any], name: str) -> Any:
    return next((c for c in entrants if c.name == name and c.rates), None)


def _equal_terms(entrants: list[Any], goal: Goal, out: list[dict[str, Any]]) -> None:
    """Catch-up medians on equal terms (bench.scenarios.fair.Contestant), against the
    better-configured peers and the baselines."""
    relay = _median_of(entrants, "relay")
    if relay is None:
        return
    for name, target in (("peer: MongoDB connector (tuned)", 2.0), ("peer: Debezium (tuned)", 3.0)):
        peer = _median_of(entrants, name)
        goal(f"catch-up / {name[6:]}", relay.median / peer.median if peer else math.nan, target)
    stream = _median_of(entrants, "baseline: bare change stream")
    goal("catch-up / bare change stream (the read limit)", relay.median / stream.median if stream else math.nan, 0.9)
    eos = _median_of(entrants, "relay, exactly-once")
    if eos is not None:
        goal("exactly-once / at-least-once", eos.median / relay.median, 0.95)
    cleaning = next((c for c in entrants if c.name.startswith("relay + clean-up") and c.rates), None)
    if cleaning is not None:
        out.append({"goal": "catch-up with clean-up on / off (cost, no target)", "value": cleaning.median / relay.median,
                    "target": 0.0, "unit": "x", "met": None})
    bare = _median_of(entrants, "baseline: bare relay")
    goal("catch-up / bare relay (200 B)", relay.median / bare.median if bare else math.nan, 0.9)


def _nats(entrants: list[Any], goal: Goal, out: list[dict[str, Any]]) -> None:
    """Issue 51: the relay to NATS against the bare relay to NATS, each mode (medians on equal terms);
    the relay to NATS against the relay to Kafka of the same rounds, reported with no target."""
    bare = _median_of(entrants, "baseline: bare relay to NATS")
    for name, what in (("relay to NATS", "at-least-once"), ("relay to NATS, exactly-once", "exactly-once")):
        relay = _median_of(entrants, name)
        if relay is not None or bare is not None:
            goal(f"NATS {what}: relay to NATS / bare relay to NATS",
                 relay.median / bare.median if relay and bare else math.nan, 0.9)
    nats, kafka = _median_of(entrants, "relay to NATS"), _median_of(entrants, "relay to Kafka (reference)")
    if nats is not None and kafka is not None:
        out.append({"goal": "NATS: relay to NATS / relay to Kafka, catch-up (no target)",
                    "value": nats.median / kafka.median, "target": 0.0, "unit": "x", "met": None})
        out.append({"goal": "NATS: relay to NATS / relay to Kafka, CPU per event (no target)",
                    "value": nats.median_of("cpu_us_per_event") / kafka.median_of("cpu_us_per_event"),
                    "target": 0.0, "unit": "x", "met": None})


def _rabbitmq(entrants: list[Any], goal: Goal, out: list[dict[str, Any]]) -> None:
    """Issue 53: the relay to RabbitMQ against the bare relay to RabbitMQ (medians on equal terms);
    against the relay to Kafka of the same rounds, reported with no target."""
    relay, bare = _median_of(entrants, "relay to RabbitMQ"), _median_of(entrants, "baseline: bare relay to RabbitMQ")
    if relay is not None or bare is not None:
        goal("RabbitMQ: relay to RabbitMQ / bare relay to RabbitMQ",
             relay.median / bare.median if relay and bare else math.nan, 0.9)
    kafka = _median_of(entrants, "relay to Kafka (reference)")
    if relay is not None and kafka is not None:
        out.append({"goal": "RabbitMQ: relay to RabbitMQ / relay to Kafka, catch-up (no target)",
                    "value": relay.median / kafka.median, "target": 0.0, "unit": "x", "met": None})
        out.append({"goal": "RabbitMQ: relay to RabbitMQ / relay to Kafka, CPU per event (no target)",
                    "value": relay.median_of("cpu_us_per_event") / kafka.median_of("cpu_us_per_event"),
                    "target": 0.0, "unit": "x", "met": None})


def _p99_beside(summaries: list[Any], out: list[dict[str, Any]], prefix: str, contender: str,
                beside: tuple[tuple[str, str], ...] = ()) -> None:
    """At each steady-state step, `contender`'s p99 beside the relay on Kafka's and, named in
    `beside` as (contender, words), others' (medians of the rounds whose writer kept the rate);
    its ratio to the relay on Kafka's reported with no target (issues 51 and 53)."""
    for mine in (s for s in summaries if s.contender == contender):
        def p99(name: str, step: Any = mine.step) -> float:
            found = next((s for s in summaries if s.step == step and s.contender == name), None)
            return found.median("p99_ms") if found else math.nan

        others = "".join(f" / {words} {_ms(p99(name))}" for name, words in beside
                         if any(s.step == mine.step and s.contender == name for s in summaries))
        p99_ms, kafka_p99 = mine.median("p99_ms"), p99("relay")
        out.append({"goal": f"{prefix}: p99 at {mine.step.label}, {contender} {_ms(p99_ms)} / on Kafka "
                            f"{_ms(kafka_p99)}{others} (no target)",
                    "value": p99_ms / kafka_p99 if kafka_p99 > 0 else math.nan, "target": 0.0, "unit": "x", "met": None})


def _single_samples(report: Any, goal: Goal) -> None:
    relay = report.relay()
    goal("catch-up / MongoDB Kafka source connector", ratio(relay, report.row(COMPARED[0][0])), 2.0)
    goal("catch-up / Debezium", ratio(relay, report.row(COMPARED[1][0])), 3.0)
    goal("catch-up / bare change stream", ratio(relay, report.row("baseline: bare change stream")), 0.9)
    goal("catch-up / bare relay", ratio(relay, report.row("baseline: bare relay")), 0.9)


def _variants(report: Any, goal: Goal) -> None:
    """Every payload at least 0.9 of its bare relay (issue 45)."""
    for key in [k for k in report.variants if k != "default"]:
        target = 0.9
        pair = report.variant_fair.get(key)
        if pair:  # medians of the rounds on equal terms
            relay_median, bare_median = (c.median for c in pair[:2])
            goal(f"{report.variants[key]} / its bare relay (medians of {len(pair[0].rows)} rounds)",
                 relay_median / bare_median if bare_median > 0 else math.nan, target)
        else:
            bare = report.row("baseline: bare relay", key)
            goal(f"{report.variants[key]} / its bare relay", ratio(report.relay(key), bare), target)


def _latency(summaries: list[Any], goal: Goal) -> None:
    """At every steady-state step: the relay's p99 against the best peer's (medians of the rounds
    whose writer kept the rate); at 1,000 events/s, its own share's p99."""
    for relay in (s for s in summaries if s.contender == "relay"):
        step = relay.step
        peers = [s for s in summaries if s.step == step and not s.contender.startswith("relay")
                 and not math.isnan(s.median("p99_ms"))]
        best = min(peers, key=lambda s: s.median("p99_ms")) if peers else None
        missed = "" if relay.counted else "; the writer missed its target in every round"
        if peers or not relay.counted:
            goal(f"p99 at {step.label} / best peer's ({best.contender if best else 'no peer'}: "
                 f"{_ms(best.median('p99_ms') if best else math.nan)}; relay {_ms(relay.median('p99_ms'))}{missed})",
                 relay.median("p99_ms") / best.median("p99_ms") if best else math.nan, 0.5, False)
        if step.rate == 1000:
            goal(f"relay's own share p99 at {step.label}{missed}", relay.median("own_p99_ms"), 10.0, False, "ms")


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f} ms"


def format_goals(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [TITLE]
    for g in rows:
        value = "-" if math.isnan(g["value"]) else f"{g['value']:.2f}"
        if g["target"] == 0 and g["met"] is None:
            lines.append(f"  {g['goal']:<62} {value:>8} {g['unit']:<2} (reported, no goal)")
            continue
        verdict = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
        op = ">=" if g["higher_is_better"] else "<="
        lines.append(f"  {g['goal']:<62} {value:>8} {g['unit']:<2} (goal {op} {g['target']:g}) {verdict}")
    return lines

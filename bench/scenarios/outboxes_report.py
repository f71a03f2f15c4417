"""The many-outboxes scenario's report (bench.scenarios.outboxes): medians of the rounds, the
ratios shared relay / sidecars, issue 36's goals (reported, never asserted) and the printed tables.
Everything here reads the scenario's results as the plain data bench.run writes into its JSON."""

from __future__ import annotations

import math
import statistics
from typing import Any

MISSED_BY = 0.05  # a latency step whose writer reached less than (1 - this) x its target is left out of the ratios


def label(n: int, shared: bool) -> str:
    if shared:
        return f"shared relay ({n} outbox{'es' if n > 1 else ''})"
    return f"{n} sidecar{'s' if n > 1 else ''}"


FLAT = 1.25  # "flat from 1 to 4 partitions": the most mongod CPU per event may grow, read as a ratio


def _value(row: dict[str, Any], key: str) -> float:
    value = row["extra"].get(key) if key not in row else row[key]
    return math.nan if value is None else float(value)


def _ok(row: dict[str, Any]) -> bool:
    return not row.get("error")


def runs(result: dict[str, Any], n: int, shared: bool) -> list[dict[str, Any]]:
    """The catch-up rows of one contestant that did not fail."""
    return [r for r in result["catch_up"] if r["extra"]["n"] == n and r["extra"]["shared"] == shared and _ok(r)]


def median(rows: list[dict[str, Any]], key: str) -> float:
    values = [v for v in (_value(r, key) for r in rows) if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def spread(rows: list[dict[str, Any]], key: str) -> str:
    values = [v for v in (_value(r, key) for r in rows) if not math.isnan(v)]
    return f"({min(values):,.0f}-{max(values):,.0f})" if len(values) > 1 else ""


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 36's goals, from the medians (reported, never asserted)."""
    counts = result["options"]["counts"]
    lo, hi = min(counts), max(counts)
    out: list[dict[str, Any]] = []

    def goal(what: str, value: float, target: float, higher_is_better: bool) -> None:
        met = None if math.isnan(value) else (value >= target if higher_is_better else value <= target)
        out.append({"goal": what, "value": value, "target": target, "unit": "x", "met": met,
                    "higher_is_better": higher_is_better})

    shared, sidecars = runs(result, hi, True), runs(result, hi, False)
    if lo != hi:
        goal(f"shared relay, mongod CPU/event at N = {hi} / at N = {lo}",
             _ratio(median(shared, "mongod_cpu_us_per_event"), median(runs(result, lo, True), "mongod_cpu_us_per_event")),
             1.5, False)
    if hi > 1:
        for what, key, target, higher in (("mongod CPU/event", "mongod_cpu_us_per_event", 0.1, False),
                                          ("total peak RSS", "peak_rss_mb", 0.1, False),
                                          ("catch-up events/s", "events_per_s", 1.0, True)):
            goal(f"N = {hi}: shared relay / {hi} sidecars, {what}", _ratio(median(shared, key), median(sidecars, key)),
                 target, higher)
    relays = [r for r in result["partitions"] if r["kind"] == "relay" and _ok(r)]
    ks = sorted({r["extra"]["k"] for r in relays})
    if len(ks) > 1:
        def at(k: int) -> float:
            return median([r for r in relays if r["extra"]["k"] == k], "mongod_cpu_us_per_event")

        goal(f"one relay process, mongod CPU/event at RELAY_PARTITIONS = {ks[-1]} / at {ks[0]} (flat: <= {FLAT})",
             _ratio(at(ks[-1]), at(ks[0])), FLAT, False)
    return out


# ---- text --------------------------------------------------------------------------------------------

def _f(value: float, spec: str = ",.0f", width: int = 0) -> str:
    text = "-" if value is None or math.isnan(value) else format(value, spec)
    return f"{text:>{width}}"


def format_outboxes(result: dict[str, Any]) -> list[str]:
    """The scenario's tables: catch-up, ratios, latency, partitions, goals."""
    if not result:
        return []
    return [*_catch_up_table(result), "", *_latency_table(result), "", *_partition_table(result), "",
            *_goal_lines(result)]


def _catch_up_table(result: dict[str, Any]) -> list[str]:
    o = result["options"]
    lines = [f"many outboxes, one change stream (issue 36): catch-up of {o['events']:,} events spread over N outboxes "
             f"of one database, each contestant on a fresh backlog, servers idle first, {o['rounds']} rounds "
             "(order rotated); medians (range)",
             f"{'N':>3}  {'contestant':<22} {'events/s':>8} {'range':>15} {'drain/s':>8} {'mongod µs/ev':>12} "
             f"{'relays µs/ev':>12} {'after start':>11} {'start-up s':>10} {'RSS MB':>7} {'other cores':>11}"]
    for n in o["counts"]:
        for shared in (False, True):
            rows = runs(result, n, shared)
            failed = [r for r in result["catch_up"] if r["extra"]["n"] == n and r["extra"]["shared"] == shared
                      and not _ok(r)]
            if not rows:
                lines.append(f"{n:>3}  {label(n, shared):<22} FAILED: {'; '.join(r['error'] for r in failed)[:300]}")
                continue
            lines.append(f"{n:>3}  {label(n, shared):<22} {_f(median(rows, 'events_per_s'), ',.0f', 8)} "
                         f"{spread(rows, 'events_per_s'):>15} {_f(median(rows, 'drain_events_per_s'), ',.0f', 8)} "
                         f"{_f(median(rows, 'mongod_cpu_us_per_event'), '.1f', 12)} "
                         f"{_f(median(rows, 'cpu_us_per_event'), '.0f', 12)} "
                         f"{_f(median(rows, 'after_start_up_cpu_us_per_event'), '.0f', 11)} "
                         f"{_f(median(rows, 'start_up_s'), '.1f', 10)} {_f(median(rows, 'peak_rss_mb'), '.0f', 7)} "
                         f"{_f(median(rows, 'other_cores'), '.2f', 11)}"
                         + (f"  ({len(failed)} failed)" if failed else ""))
    lines += ["  events/s from the processes' launch (start-up included); drain/s from the first message in Kafka to "
              "the last; relays µs/ev = the CPU of every relay process summed, per event; after start = the same "
              "from each process's holding all its leases; start-up s = launch to the last process holding its "
              "leases; RSS = the sum of the processes' sampled peaks; other cores = CPU other work took meanwhile",
              "", "shared relay / sidecars, ratios of the medians (mongod µs/ev: also the shared relay at N / at "
              f"N = {min(o['counts'])})",
              f"{'N':>3}  {'catch-up':>8} {'drain':>6} {'mongod/ev':>9} {'relays/ev':>9} {'after start':>11} "
              f"{'RSS':>6} {'mongod vs N=' + str(min(o['counts'])):>14}"]
    lo = runs(result, min(o["counts"]), True)
    for n in o["counts"]:
        a, b = runs(result, n, True), runs(result, n, False)
        cells = [_ratio(median(a, k), median(b, k)) for k in ("events_per_s", "drain_events_per_s",
                                                             "mongod_cpu_us_per_event", "cpu_us_per_event",
                                                             "after_start_up_cpu_us_per_event", "peak_rss_mb")]
        grow = _ratio(median(a, "mongod_cpu_us_per_event"), median(lo, "mongod_cpu_us_per_event"))
        lines.append(f"{n:>3}  {_f(cells[0], '.2f', 8)} {_f(cells[1], '.2f', 6)} {_f(cells[2], '.3f', 9)} "
                     f"{_f(cells[3], '.2f', 9)} {_f(cells[4], '.2f', 11)} {_f(cells[5], '.3f', 6)} {_f(grow, '.2f', 14)}")
    return lines


def _latency_table(result: dict[str, Any]) -> list[str]:
    steps = result["latency"]
    if not steps:
        return []
    o = result["options"]
    lines = [f"latency at {o['rate']:,.0f} events/s in all for {o['seconds']:g} s, the writes to the N outboxes in "
             "turn (one transaction each): commit's oplog wall time -> broker append (LogAppendTime)",
             f"{'N':>3}  {'contestant':<22} {'reached/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
             f"{'relays µs/ev':>12} {'mongod µs/ev':>12} {'RSS MB':>7} {'other cores':>11} "
             f"{'start-up: s, relays / mongod CPU s':>34}  note"]
    for s in steps:
        name = label(s["n"], s["shared"])
        if s["error"]:
            lines.append(f"{s['n']:>3}  {name:<22} FAILED: {s['error'].splitlines()[0][:300]}")
            continue
        note = "" if s["kept"] else f"WRITER MISSED the target by > {MISSED_BY:.0%}: left out of the ratios"
        note += f" MISSING {s['missing']}" if s["missing"] else ""
        note += f" duplicates {s['duplicates']}" if s["duplicates"] else ""
        lines.append(f"{s['n']:>3}  {name:<22} {_f(s['reached_rate'], ',.0f', 9)} {_f(s['p50_ms'], '.1f', 7)} "
                     f"{_f(s['p99_ms'], '.1f', 7)} {_f(s['max_ms'], '.1f', 7)} {_f(s['cpu_us_per_event'], '.0f', 12)} "
                     f"{_f(s['mongod_cpu_us_per_event'], '.0f', 12)} {_f(s['peak_rss_mb'], '.0f', 7)} "
                     f"{_f(s['other_cores'], '.2f', 11)} {_f(s['start_up_s'], '.1f', 17)}, "
                     f"{_f(s['start_up_cpu_s'], '.1f', 6)} / {_f(s['start_up_mongod_cpu_s'], '.2f', 6)}  {note}".rstrip())
    lines.append("  relays µs/ev, mongod µs/ev, RSS: during the writes; start-up: from the launch to every stream "
                 "open (no events yet), with the CPU the relay processes (summed) and mongod used meanwhile")
    for n in o["counts"]:
        pair = {s["shared"]: s for s in steps if s["n"] == n and not s["error"] and s["kept"]}
        if len(pair) == 2:
            lines.append(f"  N = {n}: p99 shared relay / sidecars = "
                         f"{_f(_ratio(pair[True]['p99_ms'], pair[False]['p99_ms']), '.2f')}")
    return lines


def _partition_table(result: dict[str, Any]) -> list[str]:
    rows = result["partitions"]
    if not rows:
        return []
    o = result["options"]
    lines = [f"partitions, one reader per process: one outbox, a fresh {o['events']:,}-event backlog each, "
             f"{o['rounds']} rounds (order rotated); medians (range)",
             f"{'contestant':<34} {'events/s':>8} {'range':>15} {'mongod µs/ev':>12} {'range':>11} {'vs first':>8} "
             f"{'process µs/ev':>13} {'other cores':>11}"]
    first = math.nan
    for kind in ("relay", "streams"):
        for k in o["partitions"]:
            group = [r for r in rows if r["kind"] == kind and r["extra"]["k"] == k and _ok(r)]
            name = next((r["scenario"] for r in rows if r["kind"] == kind and r["extra"]["k"] == k), f"{kind} {k}")
            if kind == "streams":
                name += " (bare)"
            if not group:
                errors = "; ".join(r["error"] or "" for r in rows if r["kind"] == kind and r["extra"]["k"] == k)
                lines.append(f"{name:<34} FAILED: {errors[:300]}")
                continue
            mongod = median(group, "mongod_cpu_us_per_event")
            first = mongod if math.isnan(first) and kind == "relay" else first
            lines.append(f"{name:<34} {_f(median(group, 'events_per_s'), ',.0f', 8)} {spread(group, 'events_per_s'):>15} "
                         f"{_f(mongod, '.1f', 12)} {spread(group, 'mongod_cpu_us_per_event'):>11} "
                         f"{_f(_ratio(mongod, first), '.2f', 8)} {_f(median(group, 'cpu_us_per_event'), '.0f', 13)} "
                         f"{_f(median(group, 'other_cores'), '.2f', 11)}")
    lines.append("  relay rows: `outbox-relay run` with RELAY_PARTITIONS = P leading all P, events/s from its launch; "
                 "bare rows: K change streams with the K partitions' pipelines read in this process at once, what one "
                 "process leading K partitions opened before issue 36 (the relay has no such mode now); vs first = "
                 "mongod µs/ev / the first relay row's; process µs/ev = the relay's process, or this one for the bare "
                 "streams")
    return lines


def _goal_lines(result: dict[str, Any]) -> list[str]:
    lines = ["goals (issue 36; reported, never asserted)"]
    for g in result.get("goals") or goals(result):
        verdict = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
        sign = ">=" if g["higher_is_better"] else "<="
        lines.append(f"  {g['goal']:<78} {_f(g['value'], '.3f', 7)}x  (goal {sign} {g['target']:g})  {verdict}")
    start, end = result["load_average_at_start"], result.get("load_average_at_end", (math.nan,) * 3)
    lines.append(f"  load average (1 min) at start {start[0]:.2f}, at end {end[0]:.2f}; "
                 f"{result.get('wall_seconds', math.nan):.0f} s")
    return lines

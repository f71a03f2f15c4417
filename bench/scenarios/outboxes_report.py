"""The many-outboxes scenario's report (bench.scenarios.outboxes): medians of the rounds, the
ratios shared relay / sidecars, issue 36's goals (reported, never asserted) and the printed tables.
Everything here reads the scenario's results as the plain data bench.run writes into its JSON."""

from __future__ import annotations

import math
import statistics
from typing import Any

MISSED_BY = 0.05  # a latency step whose writer reached less than (1 - this) x its target is left out of the ratios


SIDECARS, SHARED, STREAM = "sidecars", "shared", "stream"  # the catch-up's contestants of each count N


def label(n: int, who: str) -> str:
    outboxes = f"{n} outbox{'es' if n > 1 else ''}"
    return {SIDECARS: f"{n} sidecar{'s' if n > 1 else ''}", SHARED: f"shared relay ({outboxes})",
            STREAM: f"bare stream ({outboxes})"}[who]


FLAT = 1.25  # "flat from 1 to 4 partitions": the most mongod CPU per event may grow, read as a ratio


def _value(row: dict[str, Any], key: str) -> float:
    value = row["extra"].get(key) if key not in row else row[key]
    return math.nan if value is None else float(value)


def _ok(row: dict[str, Any]) -> bool:
    return not row.get("error")


def rows_of(result: dict[str, Any], n: int, who: str) -> list[dict[str, Any]]:
    """The catch-up rows of one contestant, failed ones included."""
    return [r for r in result["catch_up"] if r["extra"]["n"] == n and r["extra"]["contestant"] == who]


def runs(result: dict[str, Any], n: int, who: str) -> list[dict[str, Any]]:
    """The catch-up rows of one contestant that did not fail."""
    return [r for r in rows_of(result, n, who) if _ok(r)]


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

    shared, sidecars = runs(result, hi, SHARED), runs(result, hi, SIDECARS)
    if lo != hi:
        goal(f"shared relay, mongod CPU/event at N = {hi} / at N = {lo}",
             _ratio(median(shared, "mongod_cpu_us_per_event"), median(runs(result, lo, SHARED), "mongod_cpu_us_per_event")),
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
    """The scenario's tables: catch-up, ratios, mongod's operations, latency, partitions, goals."""
    if not result:
        return []
    blocks = [_catch_up_table(result), _ratio_table(result), _ops_table(result), _latency_table(result),
              _partition_table(result), _goal_lines(result)]
    return [line for i, block in enumerate(b for b in blocks if b) for line in ([""] if i else []) + block]


def _catch_up_table(result: dict[str, Any]) -> list[str]:
    o = result["options"]
    lines = [f"many outboxes, one change stream (issue 36): catch-up of {o['events']:,} events spread over N outboxes "
             f"of one database, each contestant on a fresh backlog, servers idle first, {o['rounds']} rounds "
             "(order rotated); medians (range)",
             f"{'N':>3}  {'contestant':<26} {'events/s':>8} {'range':>15} {'drain/s':>8} {'mongod µs/ev':>12} "
             f"{'range':>9} {'relays µs/ev':>12} {'after start':>11} {'start-up s':>10} {'RSS MB':>7} "
             f"{'other cores':>11}"]
    for n in o["counts"]:
        for who in (SIDECARS, SHARED, STREAM):
            rows, every = runs(result, n, who), rows_of(result, n, who)
            failed = [r["error"] for r in every if not _ok(r)]
            if not every:
                continue
            if not rows:
                lines.append(f"{n:>3}  {label(n, who):<26} FAILED: {'; '.join(failed)[:300]}")
                continue
            lines.append(f"{n:>3}  {label(n, who):<26} {_f(median(rows, 'events_per_s'), ',.0f', 8)} "
                         f"{spread(rows, 'events_per_s'):>15} {_f(median(rows, 'drain_events_per_s'), ',.0f', 8)} "
                         f"{_f(median(rows, 'mongod_cpu_us_per_event'), '.1f', 12)} "
                         f"{spread(rows, 'mongod_cpu_us_per_event'):>9} "
                         f"{_f(median(rows, 'cpu_us_per_event') if who != STREAM else math.nan, '.0f', 12)} "
                         f"{_f(median(rows, 'after_start_up_cpu_us_per_event'), '.0f', 11)} "
                         f"{_f(median(rows, 'start_up_s'), '.1f', 10)} {_f(median(rows, 'peak_rss_mb'), '.0f', 7)} "
                         f"{_f(median(rows, 'other_cores'), '.2f', 11)}"
                         + (f"  ({len(failed)} failed)" if failed else ""))
    lines.append("  events/s and drain/s: from the first message's append time to the last one's, start-up apart (the "
                 "bare stream, read in the benchmark's process: from its first command); relays µs/ev = the CPU of every relay process "
                 "summed, per event; after start = the same from each process's holding all its leases; start-up s = "
                 "launch to the first message; RSS = the sum of the processes' sampled peaks; "
                 "other cores = CPU other work took meanwhile")
    return lines


def _ratio_table(result: dict[str, Any]) -> list[str]:
    counts = result["options"]["counts"]
    lo = runs(result, min(counts), SHARED)
    lines = [f"shared relay / sidecars, ratios of the medians; the shared relay's mongod µs/ev also / its own at "
             f"N = {min(counts)}, and / its bare stream's",
             f"{'N':>3}  {'catch-up':>8} {'drain':>6} {'mongod/ev':>9} {'relays/ev':>9} {'after start':>11} "
             f"{'RSS':>6} {'mongod vs N=' + str(min(counts)):>14} {'vs bare stream':>14}"]
    for n in counts:
        a, b = runs(result, n, SHARED), runs(result, n, SIDECARS)
        cells = [_ratio(median(a, k), median(b, k)) for k in ("events_per_s", "drain_events_per_s",
                                                             "mongod_cpu_us_per_event", "cpu_us_per_event",
                                                             "after_start_up_cpu_us_per_event", "peak_rss_mb")]
        mongod = median(a, "mongod_cpu_us_per_event")
        grow = _ratio(mongod, median(lo, "mongod_cpu_us_per_event"))
        bare = _ratio(mongod, median(runs(result, n, STREAM), "mongod_cpu_us_per_event"))
        lines.append(f"{n:>3}  {_f(cells[0], '.2f', 8)} {_f(cells[1], '.2f', 6)} {_f(cells[2], '.3f', 9)} "
                     f"{_f(cells[3], '.2f', 9)} {_f(cells[4], '.2f', 11)} {_f(cells[5], '.3f', 6)} "
                     f"{_f(grow, '.2f', 14)} {_f(bare, '.2f', 14)}")
    return lines


def _ops_table(result: dict[str, Any]) -> list[str]:
    """mongod's operations per 1,000 backlog events (serverStatus opcounters), medians."""
    keys = ("getmore", "query", "update", "insert", "command")
    lines = ["mongod's operations per 1,000 events during the catch-up (serverStatus opcounters; medians)",
             f"{'N':>3}  {'contestant':<26} " + " ".join(f"{k:>8}" for k in keys)]
    for n in result["options"]["counts"]:
        for who in (SIDECARS, SHARED, STREAM):
            rows = [r for r in runs(result, n, who) if r["extra"].get("mongod_ops")]
            if rows:
                per = [statistics.median(r["extra"]["mongod_ops"][k] * 1000 / r["events"] for r in rows) for k in keys]
                lines.append(f"{n:>3}  {label(n, who):<26} " + " ".join(_f(v, ',.1f', 8) for v in per))
    lines.append("  update: the relays' fenced checkpoints, lease renewals and group heartbeats (update_one); "
                 "command includes findAndModify (taking a lease); query includes the benchmark's own polls of the "
                 "lease documents until every process holds its leases")
    return lines


def _latency_table(result: dict[str, Any]) -> list[str]:
    steps = result["latency"]
    if not steps:
        return []
    o = result["options"]
    lines = [f"latency at {o['rate']:,.0f} events/s in all for {o['seconds']:g} s, the writes to the N outboxes in "
             "turn (one transaction each): commit's oplog wall time -> broker append (LogAppendTime)",
             f"{'N':>3}  {'contestant':<26} {'reached/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
             f"{'relays µs/ev':>12} {'mongod µs/ev':>12} {'RSS MB':>7} {'other cores':>11} "
             f"{'start-up: s, relays / mongod CPU s':>34}  note"]
    for s in steps:
        name = label(s["n"], SHARED if s["shared"] else SIDECARS)
        if s["error"]:
            lines.append(f"{s['n']:>3}  {name:<26} FAILED: {s['error'].splitlines()[0][:300]}")
            continue
        note = "" if s["kept"] else f"WRITER MISSED the target by > {MISSED_BY:.0%}: left out of the ratios"
        note += f" MISSING {s['missing']}" if s["missing"] else ""
        note += f" duplicates {s['duplicates']}" if s["duplicates"] else ""
        lines.append(f"{s['n']:>3}  {name:<26} {_f(s['reached_rate'], ',.0f', 9)} {_f(s['p50_ms'], '.1f', 7)} "
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
             f"{'contestant':<48} {'events/s':>8} {'range':>15} {'mongod µs/ev':>12} {'range':>9} {'vs first':>8} "
             f"{'process µs/ev':>13} {'getmore/1k':>10} {'update/1k':>10} {'other cores':>11}"]
    first = math.nan
    for kind in ("relay", "stream", "streams"):
        for k in o["partitions"]:
            every = [r for r in rows if r["kind"] == kind and r["extra"]["k"] == k]
            group = [r for r in every if _ok(r)]
            if not every:
                continue
            if not group:
                lines.append(f"{every[0]['scenario']:<48} FAILED: {'; '.join(r['error'] for r in every)[:300]}")
                continue
            mongod = median(group, "mongod_cpu_us_per_event")
            first = mongod if math.isnan(first) else first
            ops = [statistics.median(r["extra"]["mongod_ops"][key] * 1000 / r["events"] for r in group)
                   if all(r["extra"].get("mongod_ops") for r in group) else math.nan for key in ("getmore", "update")]
            lines.append(f"{group[0]['scenario']:<48} {_f(median(group, 'events_per_s'), ',.0f', 8)} "
                         f"{spread(group, 'events_per_s'):>15} {_f(mongod, '.1f', 12)} "
                         f"{spread(group, 'mongod_cpu_us_per_event'):>9} {_f(_ratio(mongod, first), '.2f', 8)} "
                         f"{_f(median(group, 'cpu_us_per_event'), '.0f', 13)} {_f(ops[0], '.1f', 10)} "
                         f"{_f(ops[1], '.1f', 10)} {_f(median(group, 'other_cores'), '.2f', 11)}")
    lines.append("  relay rows: `outbox-relay run` leading all P partitions, events/s from its launch; \"read raw\": the "
                 "stream that process opens (mongod computes each insert's partition) read in this process; \"before "
                 "issue 36\": P change streams with the P partitions' pipelines read at once, what one process leading "
                 "P partitions opened before (the relay has no such mode now); vs first = mongod µs/ev / the first "
                 "row's; process µs/ev = the relay's process, or this one for the bare streams; getmore/1k, "
                 "update/1k = mongod's operations per 1,000 events (opcounters; each checkpoint is an update)")
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

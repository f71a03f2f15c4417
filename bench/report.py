"""The benchmark's output: the printed tables, `bench/results/latest.json`, and BENCHMARKS.md.

One table puts the relay beside everything it is compared with (the peers and the three bare
baselines) with the ratio relay / other, measured in the same run; then the payload variants,
the peers' details, the steady-state steps, the long-backlog memory run, and the issue's goals
(reported, never asserted).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import COMPARED, PARTITIONS, RELAY, RESULTS_DIR, Row, no_nan, ratio
from bench.goals import format_goals, goals
from bench.scenarios.latency import Latency
from bench.scenarios.steady import Step, Summary, format_reach, format_rounds, format_steady, summarize

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
MARK_START, MARK_END = "<!-- bench-latest -->", "<!-- /bench-latest -->"


@dataclass
class Report:
    params: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    latency: list[tuple[Step, Latency]] = field(default_factory=list)  # bench.scenarios.steady: every round
    writer_reach: list[tuple[Step, float, float]] = field(default_factory=list)  # the writer alone at each step
    long_run: list[Row] = field(default_factory=list)
    variants: dict[str, str] = field(default_factory=dict)   # key -> label, in run order
    partition_rows: list[Row] = field(default_factory=list)  # --partitions: backlog, group catch-ups, streams
    fair: list[Any] = field(default_factory=list)  # bench.scenarios.fair.Contestant: catch-up on equal terms
    variant_fair: dict[str, list[Any]] = field(default_factory=dict)  # variant key -> relay and bare relay, same way
    fair_runs: dict[str, Any] = field(default_factory=dict)  # variant key -> bench.scenarios.fair.Field (table)
    nats_fair: Any = None  # bench.scenarios.fair.Field: the NATS JetStream field on equal terms (issue 51)
    rabbitmq_fair: Any = None  # bench.scenarios.fair.Field: the RabbitMQ field on equal terms (issue 53)
    inbox: dict[str, Any] = field(default_factory=dict)  # bench.scenarios.inbox.inbox_scenario's results
    outboxes: dict[str, Any] = field(default_factory=dict)  # bench.scenarios.outboxes.outboxes_scenario's results

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "variants": self.variants, "rows": [asdict(r) for r in self.rows],
                "latency": [{"step": asdict(s), **asdict(x)} for s, x in self.latency],
                "writer_alone": [{"step": asdict(s), "events_per_s": got, "commit_p99_ms": p99}
                                 for s, got, p99 in self.writer_reach], "long_run": [asdict(r) for r in self.long_run],
                "partitions": [asdict(r) for r in self.partition_rows], "goals": goals(self),
                "equal_terms": [{"name": c.name, "median_events_per_s": c.median, "rows": [asdict(r) for r in c.rows]}
                                for c in self.fair],
                "variants_equal_terms": {k: [{"name": c.name, "median_events_per_s": c.median,
                                              "rows": [asdict(r) for r in c.rows]} for c in v]
                                         for k, v in self.variant_fair.items()},
                "equal_terms_backlogs": {k: {"drain_s": f.drain_s, "backlogs": f.backlogs,
                                             "calibration": [asdict(r) for r in f.calibration]}
                                         for k, f in self.fair_runs.items()},
                "nats_equal_terms": None if self.nats_fair is None else {
                    "drain_s": self.nats_fair.drain_s, "backlogs": self.nats_fair.backlogs,
                    "calibration": [asdict(r) for r in self.nats_fair.calibration],
                    "contestants": [{"name": c.name, "median_events_per_s": c.median,
                                     "rows": [asdict(r) for r in c.rows]} for c in self.nats_fair.entrants]},
                "rabbitmq_equal_terms": None if self.rabbitmq_fair is None else {
                    "drain_s": self.rabbitmq_fair.drain_s, "backlogs": self.rabbitmq_fair.backlogs,
                    "calibration": [asdict(r) for r in self.rabbitmq_fair.calibration],
                    "contestants": [{"name": c.name, "median_events_per_s": c.median,
                                     "rows": [asdict(r) for r in c.rows]} for c in self.rabbitmq_fair.entrants]},
                "inbox": self.inbox, "outboxes": self.outboxes}

    def row(self, prefix: str, variant: str = "default") -> Row | None:
        return next((r for r in self.rows if r.scenario.startswith(prefix) and r.variant == variant), None)

    def relay(self, variant: str = "default") -> Row | None:
        return self.row(RELAY, variant)

    def summaries(self) -> list[Summary]:
        """The steady-state steps per contender: medians of the rounds whose writer kept the rate."""
        return summarize(self.latency)


def _f(value: float, spec: str = ".0f", width: int = 0) -> str:
    text = "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)
    return f"{text:>{width}}"


# ---- text -------------------------------------------------------------------------------------

def format_report(report: Report) -> str:
    p = report.params
    only_partitions = bool(report.partition_rows) and not report.rows
    only_inbox = bool(report.inbox) and not report.rows and not report.fair
    lines = [
        f"outbox-relay benchmark  partitioned outbox only: partition-events={p.get('partition_events')}  "
        f"cpus={p['host']['cpus']}  (relays as processes; 1 mongod, 1 Kafka broker, topics of {PARTITIONS} partitions)"
        if only_partitions else
        f"outbox-relay benchmark  inbox only: inbox-events={p.get('inbox_events')}  cpus={p['host']['cpus']}  "
        f"(consumers in this process; 1 mongod, 1 Kafka broker, {PARTITIONS} partitions)"
        if only_inbox else
        f"outbox-relay benchmark  events={p['events']}  payload={p['payload_bytes']} B  cpus={p['host']['cpus']}  "
        f"(every contestant as its own process; 1 mongod, 1 Kafka broker, "
        f"{PARTITIONS} partitions" + (f"; nats-server {p['nats']['nats_server']}, nats-py {p['nats']['nats_py']}"
                                      if p.get("nats") else "")
        + (f"; rabbitmq-server {p['rabbitmq']['rabbitmq_server']}, pika {p['rabbitmq']['pika']}"
           if p.get("rabbitmq") else "") + ")"
        + ("  NATS JetStream only (issue 51)" if p.get("only_nats") else "")
        + ("  RabbitMQ only (issue 53)" if p.get("only_rabbitmq") else ""),
        f"relay code: {p['relay_source']}",
        f"command: {p['command']}",
    ]
    if "load_average_at_start" in p:
        lines.append("load average (1/5/15 min) at start " + "/".join(f"{x:.2f}" for x in p["load_average_at_start"])
                     + (", at end " + "/".join(f"{x:.2f}" for x in p["load_average_at_end"])
                        if "load_average_at_end" in p else ""))
    for block in (_fair_table, _ratio_table, _variant_table, _rows_table, _peer_table, _latency_table, _long_table,
                  _partition_table, _outboxes_table, _inbox_table, _goal_table):
        text = block(report)
        if text:
            lines += ["", *text]
    return "\n".join(lines)


def _outboxes_table(report: Report) -> list[str]:
    from bench.scenarios.outboxes_report import format_outboxes

    return format_outboxes(report.outboxes)


def _inbox_table(report: Report) -> list[str]:
    from bench.scenarios.inbox import format_inbox

    return format_inbox(report.inbox)


def _fair_table(report: Report) -> list[str]:
    from bench.scenarios.fair import format_fair

    lines: list[str] = []
    for key, run in report.fair_runs.items():
        table = format_fair(run, report.params.get("rounds", 0))
        if table and lines:
            lines += ["", f"{report.variants.get(key, key)}: " + table[0], *table[1:-1]]
        elif table:
            lines += table
    for broker_field in (report.nats_fair, report.rabbitmq_fair):
        if broker_field is not None:
            table = format_fair(broker_field, report.params.get("rounds", 0))
            lines += [*([""] if lines and table else []), *table]
    return lines


def _ratio_table(report: Report) -> list[str]:
    relay = report.relay()
    if relay is None:
        return []
    steps = ", ".join(f"p50/p99 at {s.step.rate:,.0f}/s x{s.step.batch} {_f(s.median('p50_ms'), '.1f')} / "
                      f"{_f(s.median('p99_ms'), '.1f')} ms" for s in report.summaries() if s.contender == "relay")
    lines = [
        f"relay vs the rest, same backlog ({relay.events:,} events, {report.variants.get('default', '')}), same run: "
        f"relay {relay.events_per_s:,.0f} events/s, {relay.cpu_us_per_event:.0f} µs CPU/event (relay process), "
        f"mongod {relay.mongod_cpu_us_per_event:.0f} µs/event, peak RSS {relay.peak_rss_mb:.0f} MB"
        + (f"; {steps}" if steps else ""),
        f"{'compared with':<34} {'events/s':>9} {'relay/it':>9} {'CPU µs/ev':>10} {'mongod µs/ev':>13} "
        f"{'peak RSS MB':>12}  note",
    ]
    for prefix, name in COMPARED:
        row = report.row(prefix)
        if row is None:
            continue
        if row.error:
            lines.append(f"{name:<34} FAILED: {row.error.splitlines()[0][:400]}")
            continue
        lines.append(f"{name:<34} {_f(row.events_per_s, ',.0f', 9)} {_f(ratio(relay, row), '.2f', 9)} "
                     f"{_f(row.cpu_us_per_event, '.0f', 10)} {_f(row.mongod_cpu_us_per_event, '.0f', 13)} "
                     f"{_f(row.peak_rss_mb, '.0f', 12)}  {row.note}")
    lines.append("  relay/it > 1: the relay is faster. CPU µs/ev = CPU of the process doing the work per event "
                 "(the relay, the bare relay, the bare change stream and each peer: a process of its own, from its first "
                 "event on; the bare producer: the benchmark's process); RSS sampled every 25 ms.")
    return lines


def _variant_table(report: Report) -> list[str]:
    if len(report.variants) < 2:
        return []
    lines = ["payload variants (relay and baselines on a backlog of that payload; relay/it in brackets)",
             f"{'variant':<22} {'events':>7} {'relay ev/s':>10} {'bare relay':>17} {'bare stream':>17} "
             f"{'bare producer':>18} {'CPU µs/ev':>9} {'mongod':>7} {'RSS MB':>7} {'value B':>8}"]
    for key, label in report.variants.items():
        relay = report.relay(key)
        if relay is None:
            continue
        cells = []
        for prefix, width in (("baseline: bare relay", 17), ("baseline: bare change stream", 17),
                              ("baseline: bare producer", 18)):
            other = report.row(prefix, key)
            text = "-" if other is None else f"{_f(other.events_per_s, ',.0f')} ({_f(ratio(relay, other), '.2f')})"
            cells.append(f"{text:>{width}}")
        lines.append(f"{label:<22} {relay.events:>7} {_f(relay.events_per_s, ',.0f', 10)} {' '.join(cells)} "
                     f"{_f(relay.cpu_us_per_event, '.0f', 9)} {_f(relay.mongod_cpu_us_per_event, '.0f', 7)} "
                     f"{_f(relay.peak_rss_mb, '.0f', 7)} {relay.extra.get('value_bytes', '-'):>8}")
    return lines


def _rows_table(report: Report) -> list[str]:
    if not report.rows and not report.long_run:
        return []
    width = max([36, *(len(r.scenario) for r in report.rows)])
    lines = [f"{'every row':<{width}} {'variant':<8} {'events':>8} {'seconds':>8} {'events/s':>9} "
             f"{'other cores':>11} {'iowait':>6}  note"]
    for r in report.rows + report.long_run:
        lines.append(f"{r.scenario:<{width}} {r.variant:<8} {r.events:>8} {_f(r.seconds, '.2f', 8)} "
                     f"{_f(r.events_per_s, '.0f', 9)} {_f(r.other_cores, '.2f', 11)} {_f(r.iowait_cores, '.2f', 6)}"
                     f"  {r.note}")
    lines.append("  other cores = CPU taken meanwhile by processes outside the benchmark (near 0 on a quiet "
                 "machine; larger: the figure is depressed by other load); iowait = host-wide disk wait, in cores.")
    return lines


def _peer_table(report: Report) -> list[str]:
    peers = [r for r in report.rows if r.kind == "peer" and not r.error]
    if not peers:
        return []
    relay = report.relay()
    versions = report.params.get("peers", {})
    lines = [f"peers in detail ({', '.join(f'{k} {v}' for k, v in versions.items())})",
             f"{'':<40} {'start s':>7} {'first s':>7} {'all-in ev/s':>11} {'drain ev/s':>10} {'relay/all-in':>12} "
             f"{'CPU s':>6} {'value B':>7}  message"]
    for r in peers:
        x = r.extra
        all_in = relay.events_per_s / x["all_in_events_per_s"] if relay else math.nan
        lines.append(f"{r.scenario:<40} {x['worker_start_s']:>7.1f} {x['first_message_s']:>7.1f} "
                     f"{x['all_in_events_per_s']:>11,.0f} {x['drain_events_per_s']:>10,.0f} {_f(all_in, '.2f', 12)} "
                     f"{x['cpu_s']:>6.1f} {x['value_bytes']:>7}  {x['output']}")
    lines.append("  start = process launch -> connector start (JVM, plugin scan; 0 for Conduit, timed from launch); "
                 "first = connector start -> first message; all-in = from launch; drain = N / (first -> last message)")
    return lines


def _latency_table(report: Report) -> list[str]:
    if not report.latency:
        return []
    reach = format_reach(report.writer_reach)
    return [*reach, *([""] if reach else []), *format_steady(report.summaries(), report.params.get("latency_rounds", 1)),
            "", *format_rounds(report.latency)]


def _long_table(report: Report) -> list[str]:
    relay = next((r for r in report.long_run if r.kind == "relay"), None)
    if relay is None:
        return []
    x = relay.extra
    return [f"long backlog: {relay.scenario}: {_f(relay.events_per_s, ',.0f')} events/s, peak RSS "
            f"{_f(relay.peak_rss_mb, '.1f')} MB (sampled every 25 ms; last sample "
            f"{_f(x.get('rss_after_mb') or math.nan, '.1f')} MB), "
            f"{_f(relay.cpu_us_per_event, '.0f')} µs CPU/event, "
            f"mongod {_f(relay.mongod_cpu_us_per_event, '.0f')} µs/event, {relay.seconds:.0f} s"]


def _partition_table(report: Report) -> list[str]:
    groups = [r for r in report.partition_rows if r.kind == "partitions"]
    streams = [r for r in report.partition_rows if r.kind == "streams"]
    if not groups and not streams:
        return []
    lines: list[str] = []
    setup = next((r for r in report.partition_rows if r.kind == "set-up"), None)
    if groups:
        base = next((r for r in groups if r.extra.get("partitions") == 1), None)
        written = f" (written in {setup.seconds:.0f} s, {setup.events_per_s:,.0f}/s)" if setup else ""
        lines += [f"partitioned outbox: catch-up of a {groups[0].events:,}-event backlog{written} by relay processes "
                  "(`outbox-relay run`) started together, RELAY_STANDBY_POLL_S=0.5; relays µs/ev = CPU per event of "
                  "every relay process summed, busiest = the one that used most",
                  f"{'':<36} {'events/s':>9} {'vs N=1':>7} {'drain ev/s':>10} {'relays µs/ev':>12} {'busiest':>8} "
                  f"{'mongod µs/ev':>12} {'kafka µs/ev':>11} {'other cores':>11}  note"]
        for r in groups:
            if r.error:
                lines.append(f"{r.scenario:<36} FAILED: {r.error.splitlines()[0][:300]}")
                continue
            per = [x for x in r.extra.get("cpu_us_per_event_per_process", []) if x is not None]
            drain = r.extra.get("drain_s") or math.nan
            lines.append(f"{r.scenario:<36} {_f(r.events_per_s, ',.0f', 9)} {_f(ratio(r, base), '.2f', 7)} "
                         f"{_f(r.events / drain if drain else math.nan, ',.0f', 10)} {_f(r.cpu_us_per_event, '.0f', 12)} "
                         f"{_f(max(per) if per else math.nan, '.0f', 8)} {_f(r.mongod_cpu_us_per_event, '.0f', 12)} "
                         f"{_f(r.extra.get('kafka_cpu_us_per_event') or math.nan, '.0f', 11)} "
                         f"{_f(r.other_cores, '.2f', 11)}  {r.note}")
    if streams:
        one = next((r for r in streams if r.extra.get("streams") == 1), None)
        if lines:
            lines.append("")
        lines += ["change streams open at once on that backlog (partition pipelines): mongod's CPU",
                  f"{'streams':>7} {'seconds':>8} {'events/s':>9} {'mongod µs/event':>15} {'per stream':>10} "
                  f"{'vs 1 stream':>11} {'other cores':>11}"]
        for r in streams:
            k = r.extra.get("streams", 1)
            if r.error:
                lines.append(f"{k:>7} FAILED: {r.error.splitlines()[0][:300]}")
                continue
            vs = r.mongod_cpu_us_per_event / one.mongod_cpu_us_per_event if one and one.mongod_cpu_us_per_event else math.nan
            lines.append(f"{k:>7} {_f(r.seconds, '.2f', 8)} {_f(r.events_per_s, ',.0f', 9)} "
                         f"{_f(r.mongod_cpu_us_per_event, '.1f', 15)} {_f(r.mongod_cpu_us_per_event / k, '.1f', 10)} "
                         f"{_f(vs, '.2f', 11)} {_f(r.other_cores, '.2f', 11)}")
        lines.append("  every stream reads the whole oplog: mongod's CPU per event grows with the streams open, "
                     "while each relay process's CPU per event does not depend on them")
    return lines


def _goal_table(report: Report) -> list[str]:
    measured = report.rows or report.fair or report.latency or report.nats_fair or report.rabbitmq_fair
    return format_goals(goals(report)) if measured else []


# ---- files ------------------------------------------------------------------------------------

def write_json(report: Report) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "latest.json"
    path.write_text(json.dumps(no_nan(report.to_json()), indent=2, default=str) + "\n")
    return path


def update_benchmarks_md(report: Report, text: str, path: Path = BENCHMARKS_MD) -> Path:
    """Replace the section between MARK_START and MARK_END with this run (command, commit, output)."""
    p = report.params
    section = (f"{MARK_START}\n`{p['command']}`, relay code {p['relay_source'].split(' (')[0]}, started "
               f"{p['started_at']}, wall time {p.get('wall_seconds', math.nan):.0f} s.\n\n```\n{text}\n```\n{MARK_END}")
    current = path.read_text()
    pattern = re.compile(re.escape(MARK_START) + ".*?" + re.escape(MARK_END), re.S)
    if not pattern.search(current):
        raise RuntimeError(f"{path} has no {MARK_START} ... {MARK_END} section to replace")
    path.write_text(pattern.sub(lambda _m: section, current))
    return path

"""The many-outboxes benchmark's own rules (bench/scenarios/outboxes.py; no servers): what each
contestant's processes are configured to publish, the order of the rounds, the writer taking
turns, and the ratios and goals it reports. Timings are never asserted."""

from __future__ import annotations

import math
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import pytest

from bench.common import Row
from bench.relay_under_test import relay_settings
from bench.run import parse_args
from bench.scenarios.outboxes import Options, Outboxes, Step, catch_up_order, relay_configs
from bench.scenarios.outboxes_report import SHARED, SIDECARS, STREAM, format_outboxes, goals
from bench.writer import OutboxesInTurn
from relay.config import Settings
from relay.outbox import OutboxEvent
from tests.support.relays import settings_env

STACK: Any = SimpleNamespace(mongo=SimpleNamespace(uri="mongodb://127.0.0.1:1/?replicaSet=rs0"),
                             kafka=SimpleNamespace(bootstrap_servers="127.0.0.1:2"))
OUTBOXES = Outboxes("bench_db", ("outbox_00", "outbox_01", "outbox_02"))


def _in_child(settings: Settings) -> Settings:
    """The settings an `outbox-relay run` child process reads from the environment it is given."""
    env = {k: v for k, v in settings_env(settings).items() if k.startswith("RELAY_")}
    return Settings.load(env=env)


def test_sidecars_are_one_process_per_outbox_and_the_shared_relay_one_process_listing_all() -> None:
    base = relay_settings(STACK, "bench_db", "bench.{aggregateType}", "now")
    sidecars = [_in_child(s) for s in relay_configs(base, OUTBOXES, shared=False, tag="t")]
    assert [[str(n) for n in s.namespaces] for s in sidecars] == [["bench_db.outbox_00"], ["bench_db.outbox_01"],
                                                                   ["bench_db.outbox_02"]]
    assert all(s.outboxes == "" for s in sidecars)  # RELAY_OUTBOXES unset: each a sidecar of one outbox
    assert len({s.instance_id for s in sidecars}) == 3
    shared = [_in_child(s) for s in relay_configs(base, OUTBOXES, shared=True, tag="t")]
    assert len(shared) == 1
    assert [str(n) for n in shared[0].namespaces] == ["bench_db.outbox_00", "bench_db.outbox_01", "bench_db.outbox_02"]
    assert {s.database for s in sidecars + shared} == {"bench_db"}  # the lease documents stay in that database


def test_every_round_runs_each_contestant_once_rotating_the_counts_and_who_goes_first() -> None:
    counts = [1, 5, 20]
    rounds = [catch_up_order(counts, r) for r in range(3)]
    everyone = sorted((n, who) for n in counts for who in (SIDECARS, SHARED, STREAM))
    assert all(sorted(order) == everyone for order in rounds)
    assert [order[0][0] for order in rounds] == [1, 5, 20]
    for n in counts:  # in three rounds each of a count's three contestants goes first once
        firsts = {next(who for m, who in order if m == n) for order in rounds}
        assert firsts == {SIDECARS, SHARED, STREAM}, (n, rounds)


class _Collection:
    def __init__(self) -> None:
        self.inserted: list[Any] = []

    def insert_many(self, docs: list[dict[str, Any]], ordered: bool = True, session: Any = None) -> None:
        self.inserted.append([d["_id"] for d in docs])


def test_the_writer_takes_the_outboxes_in_turn_one_write_each() -> None:
    collections = [_Collection() for _ in range(3)]
    writer = OutboxesInTurn(collections)  # type: ignore[arg-type]
    for i in range(7):
        writer.add_many([OutboxEvent.new("bench", f"a{i}", "E", {"i": i}) for _ in range(2)])
    assert [len(c.inserted) for c in collections] == [3, 2, 2]
    assert all(len(call) == 2 for c in collections for call in c.inserted)


def _row(n: int, shared: bool, events_per_s: float, mongod: float, rss: float, error: str | None = None) -> dict[str, Any]:
    return asdict(Row("x", 1000, 1.0, events_per_s, kind="outboxes", mongod_cpu_us_per_event=mongod, peak_rss_mb=rss,
                      error=error, extra={"n": n, "contestant": SHARED if shared else SIDECARS}))


def _result(catch_up: list[dict[str, Any]], latency: list[Step] = (), partitions: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"options": asdict(Options(counts=(1, 20), rounds=2)), "catch_up": catch_up,
            "latency": [asdict(s) for s in latency], "partitions": list(partitions),
            "load_average_at_start": (1.0, 1.0, 1.0)}


def test_goals_set_the_shared_relay_beside_its_sidecars_and_beside_itself_at_one_outbox() -> None:
    result = _result([
        _row(1, True, 10_000, 20, 70), _row(1, True, 12_000, 22, 70),
        _row(20, True, 11_000, 24, 150), _row(20, True, 9_000, 26, 150),
        _row(20, False, 5_000, 400, 1400), _row(20, False, 6_000, 380, 1400),
        _row(20, False, 100_000, 1, 1, error="TimeoutError: a failed round is not a figure"),
    ])
    found = {g["goal"]: g for g in goals(result)}
    growth = found["shared relay, mongod CPU/event at N = 20 / at N = 1"]
    assert growth["value"] == pytest.approx(25 / 21) and growth["met"] is True
    assert found["N = 20: shared relay / 20 sidecars, mongod CPU/event"]["value"] == pytest.approx(25 / 390)
    assert found["N = 20: shared relay / 20 sidecars, mongod CPU/event"]["met"] is True
    assert found["N = 20: shared relay / 20 sidecars, total peak RSS"]["met"] is False  # 150 / 1400 > 0.1
    assert found["N = 20: shared relay / 20 sidecars, catch-up events/s"]["value"] == pytest.approx(10_000 / 5_500)


def test_goals_are_not_measured_when_a_contestant_has_no_round() -> None:
    result = _result([_row(1, True, 10_000, 20, 70), _row(20, True, 10_000, 24, 150),
                      _row(20, False, 5_000, 400, 1400, error="RuntimeError: relay process 3 stopped")])
    found = {g["goal"]: g for g in goals(result)}
    sidecars = found["N = 20: shared relay / 20 sidecars, mongod CPU/event"]
    assert sidecars["met"] is None and math.isnan(sidecars["value"])


def test_a_latency_step_whose_writer_fell_short_is_marked_and_left_out_of_the_ratios() -> None:
    steps = [Step(1, False, 1000, reached_rate=1000, p99_ms=40, kept=True),
             Step(1, True, 1000, reached_rate=990, p99_ms=30, kept=True),
             Step(20, False, 1000, reached_rate=800, p99_ms=90, kept=False),
             Step(20, True, 1000, reached_rate=1000, p99_ms=45, kept=True)]
    text = "\n".join(format_outboxes(_result([_row(1, True, 10_000, 20, 70)], steps)))
    assert "N = 1: p99 shared relay / sidecars = 0.75" in text
    assert "N = 20: p99" not in text
    assert text.count("WRITER MISSED") == 1


def test_bench_run_runs_the_scenario_by_default_and_skips_it_with_its_flag() -> None:
    options = parse_args([]).outboxes_options
    assert (options.counts, options.partitions, options.rounds) == ((1, 5, 20), (1, 2, 4), 3)
    assert parse_args(["--no-outboxes"]).outboxes_options is None
    chosen = parse_args(["--outboxes", "2,8", "--outboxes-events", "800", "--outboxes-partitions", "",
                         "--outboxes-rate", "0"]).outboxes_options
    assert (chosen.counts, chosen.events, chosen.partitions, chosen.rate) == ((2, 8), 800, (), 0.0)
    for bad in (["--outboxes", "0,5"], ["--outboxes", "a"], ["--outboxes", "20", "--outboxes-events", "10"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_report_sets_the_shared_relay_beside_its_bare_stream_and_counts_mongod_operations() -> None:
    shared = _row(20, True, 10_000, 30, 150)
    shared["extra"]["mongod_ops"] = {"getmore": 60, "query": 5, "update": 0, "insert": 0, "command": 1200}
    stream = _row(20, True, 40_000, 20, math.nan)
    stream["extra"]["contestant"] = STREAM
    text = "\n".join(format_outboxes(_result([_row(1, True, 10_000, 20, 70), shared, stream])))
    lines = text.splitlines()
    ratios = lines[next(i for i, line in enumerate(lines) if line.endswith("vs bare stream")) + 1:]
    n20 = next(line for line in ratios if line.startswith(" 20"))
    assert n20.split()[-1] == "1.50"  # 30 / 20 µs per event
    assert "bare stream (20 outboxes)" in text
    ops = next(line for line in lines if line.startswith(" 20  shared relay (20 outboxes)") and "1,200.0" in line)
    assert ops.split()[-5:] == ["60.0", "5.0", "0.0", "0.0", "1,200.0"]  # per 1,000 events, in opcounters' order

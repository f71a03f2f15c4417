"""The NATS JetStream part of the benchmark (issue 51), its own logic with no servers: the command's
selection, the NATS field's calibration, table and goals, latencies from a stream's arrivals, the
stream names. Timings are never asserted."""

from __future__ import annotations

from typing import Any

import pytest

from bench.common import Row
from bench.events import Variant
from bench.goals import format_goals, goals
from bench.jetstream import stream_name
from bench.report import Report, format_report
from bench.scenarios import fair
from bench.scenarios.fair import Contestant, format_fair, nats_field
from bench.scenarios.latency import Latency, failed, latencies_of
from bench.scenarios.steady import Step, format_steady, summarize

VARIANT = Variant("default", "200 B generic", 200, False, 100)
PARAMS = {"host": {"cpus": 2}, "relay_source": "x", "command": "c", "events": 1, "payload_bytes": 200,
          "rounds": 3, "nats": {"nats_server": "2.15.1", "nats_py": "2.16.0"}, "only_nats": True}


def test_only_nats_runs_the_steps_of_issue_51_unless_told_otherwise() -> None:
    from bench.run import parse_args

    only = parse_args(["--only-nats"])
    assert only.only_nats and only.nats
    assert [(s.rate, s.batch) for s in only.rates] == [(500, 1), (1000, 10)]
    assert [(s.rate, s.batch) for s in parse_args(["--only-nats", "--rates", "1000x10"]).rates] == [(1000, 10)]
    assert len(parse_args([]).rates) == 3 and parse_args([]).nats        # the full run: NATS on, three steps
    assert not parse_args(["--no-nats"]).nats


@pytest.mark.parametrize("conflict", [["--no-nats"], ["--only-inbox"], ["--only-partitions"]])
def test_only_nats_refuses_what_contradicts_it(conflict: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from bench.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--only-nats", *conflict])
    assert "--only-nats cannot go with" in capsys.readouterr().err


class _Client:
    def __init__(self) -> None:
        self.dropped: list[str] = []

    def drop_database(self, name: str) -> None:
        self.dropped.append(name)


class _Backlog:
    def __init__(self, database: str, events: int) -> None:
        self.database, self.events = database, events


def test_the_nats_field_is_calibrated_by_its_own_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fair, "write_backlog", lambda _c, database, _v, events: _Backlog(database, events))
    monkeypatch.setattr(fair, "wait_idle", lambda _stack: 0.0)
    ran: list[str] = []

    def contestant(name: str, events_per_s: float) -> Contestant:
        def run(backlog: Any, _rid: str) -> Row:
            ran.append(name)
            return Row(name, backlog.events, backlog.events / events_per_s, events_per_s)
        return Contestant(name, run)

    entrants = [contestant("relay to NATS", 10_000), contestant("relay to NATS, exactly-once", 9_000),
                contestant("baseline: bare relay to NATS", 12_000), contestant("relay to Kafka (reference)", 20_000)]
    out = fair.fair_catch_up(None, _Client(), VARIANT, "run", 1, nats_field(entrants, 2.0),  # type: ignore[arg-type]
                             drain_s=2.0, probe_events=1000)
    assert ran[:3] == ["relay to NATS", "baseline: bare relay to NATS", "relay to Kafka (reference)"]  # no EOS probe
    assert out.backlogs == [48_000]                  # the fastest probe (20,000/s) x 2 s x 1.2
    assert out.reference == "relay to NATS" and out.broker_role == "nats"


def _with(name: str, rates: list[float], cpu: float = 100.0, nats_cpu: float = 25.0) -> Contestant:
    c = Contestant(name, lambda b, r: Row(name, 0, 0, 0))
    c.rows = [Row(name, 1000, 1000 / x, x, cpu_us_per_event=cpu, mongod_cpu_us_per_event=30.0, peak_rss_mb=66.0,
                  extra={"start_up_s": 1.0, "nats_cpu_us_per_event": nats_cpu}) for x in rates]
    return c


def _nats_report(eos: list[float]) -> Report:
    entrants = [_with("relay to NATS", [9_000, 9_500, 10_000], cpu=140.0),
                _with("relay to NATS, exactly-once", eos, cpu=150.0),
                _with("baseline: bare relay to NATS", [10_000, 10_000, 10_500], cpu=130.0),
                _with("relay to Kafka (reference)", [19_000, 20_000, 21_000], cpu=50.0, nats_cpu=0.0)]
    return Report(params=PARAMS, nats_fair=nats_field(entrants, 15.0))


def test_the_goal_of_issue_51_is_each_mode_against_the_bare_relay_to_nats() -> None:
    found = {g["goal"]: g for g in goals(_nats_report(eos=[8_000, 8_500, 9_000]))}
    alo = found["NATS at-least-once: relay to NATS / bare relay to NATS"]
    eos = found["NATS exactly-once: relay to NATS / bare relay to NATS"]
    assert alo["value"] == pytest.approx(0.95) and alo["met"] is True and alo["target"] == 0.9
    assert eos["value"] == pytest.approx(0.85) and eos["met"] is False
    beside = found["NATS: relay to NATS / relay to Kafka, catch-up (no target)"]
    assert beside["value"] == pytest.approx(0.475) and beside["met"] is None
    assert found["NATS: relay to NATS / relay to Kafka, CPU per event (no target)"]["value"] == pytest.approx(2.8)
    assert not any("MongoDB" in g or "Debezium" in g for g in found)   # no Kafka catch-up: no peer goals
    text = "\n".join(format_goals(list(found.values())))
    assert "MISSED" in text and "met" in text and "(reported, no goal)" in text


def test_a_mode_that_never_ran_is_not_measured_rather_than_met() -> None:
    report = _nats_report(eos=[])
    found = {g["goal"]: g for g in goals(report)}
    assert found["NATS exactly-once: relay to NATS / bare relay to NATS"]["met"] is None


def test_the_nats_table_compares_with_the_relay_to_nats_and_shows_the_servers_cpu() -> None:
    report = _nats_report(eos=[8_000, 8_500, 9_000])
    report.nats_fair.backlogs = [300_000] * 3
    lines = format_fair(report.nats_fair, 3)
    assert lines[0].startswith("NATS JetStream (issue 51): catch-up on equal terms")
    assert "nats µs/ev" in lines[1]
    bare = next(line for line in lines if line.startswith("baseline: bare relay to NATS"))
    assert " 0.95 " in bare                                 # relay/it: 9,500 / 10,000
    assert "JetStream's stored times" in lines[-1] and "the median of relay to NATS" in lines[-1]
    text = format_report(report)
    assert "nats-server 2.15.1" in text and "NATS JetStream only" in text and "goals (issues 37, 45, 51 and 53" in text


def _latency(contender: str, p99: float) -> Latency:
    x = failed(contender, 1000, 10, "")
    x.error, x.achieved_rate, x.p50_ms, x.p99_ms = None, 1000.0, p99 / 4, p99
    return x


def test_latency_of_the_relay_to_nats_is_reported_beside_the_relay_on_kafka() -> None:
    step = Step(1000, 10)
    summaries = summarize([(step, _latency("relay", 20.0)), (step, _latency("relay to NATS", 30.0))])
    found = {g["goal"]: g for g in goals(Report(params=PARAMS, latency=[(step, _latency("relay", 20.0)),
                                                                         (step, _latency("relay to NATS", 30.0))]))}
    nats = next(g for name, g in found.items() if name.startswith("NATS: p99 at 1,000 events/s"))
    assert nats["value"] == pytest.approx(1.5) and nats["met"] is None and "30 ms" in nats["goal"]
    assert "JetStream stream" in "\n".join(format_steady(summaries, 1))


def test_latencies_from_a_streams_arrivals_match_event_ids_and_count_duplicates() -> None:
    committed = {"a": 10.0, "b": 10.5}                      # commit returned (s)
    walls = {"a": 9.99, "b": 10.49}                         # oplog wall time (s)
    arrivals = [("w", 10_000.0), ("a", 10_020.0), ("b", 10_600.0), ("a", 10_700.0)]  # (Nats-Msg-Id, stored ms)
    from_wall, from_returned, duplicates = latencies_of(arrivals, committed, walls, warm_up_ids={"w"})
    assert from_wall == pytest.approx([30.0, 110.0]) and from_returned == pytest.approx([20.0, 100.0])
    assert duplicates == 1


def test_stream_names_hold_nothing_jetstream_refuses() -> None:
    name = stream_name("bench", "ab12r0cd", "nats-catchup.default", "x y/z")
    assert name == "bench_ab12r0cd_nats-catchup_default_x_y_z"


def test_a_relay_to_nats_that_failed_every_round_still_shows_its_table() -> None:
    failed_relay = Contestant("relay to NATS", lambda b, r: Row("x", 0, 0, 0))
    failed_relay.rows = [Row("relay to NATS", 0, 0, 0, error="RuntimeError: the relay process ended")]
    bare = _with("baseline: bare relay to NATS", [10_000])
    lines = format_fair(nats_field([failed_relay, bare], 15.0), 1)
    assert any(line.startswith("relay to NATS") and "FAILED: RuntimeError" in line for line in lines)
    assert any(line.startswith("baseline: bare relay to NATS") and " nan " in line for line in lines)  # no ratio

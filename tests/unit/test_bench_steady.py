"""The latency harness's rules (no servers): steps, which rounds count, the goals drawn from them,
and the tail tool's split of a parcel's own share. Timings are never asserted."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.goals import format_goals, goals
from bench.report import Report, format_report
from bench.scenarios.latency import Latency, failed
from bench.scenarios.steady import Step, format_rounds, parse_steps, summarize
from bench.tail import Sample, Timed, summary


def _round(contender: str, p99: float, reached: float, target: float = 1000, own_p99: float = math.nan,
           r: int = 0) -> Latency:
    nan = math.nan
    x = Latency(target, 10, 20_000, 20.0, reached, 20_000, 0, 0, p99 / 4, p99, p99 * 2, 1.0, nan, nan, nan,
                nan, nan, nan, 0.0, 30.0, 500.0, 50.0, 0.1, contender=contender, own_p99_ms=own_p99)
    x.round = r
    return x


def test_steps_are_rates_with_events_per_transaction() -> None:
    assert parse_steps("500, 1000x10,10000x100") == [Step(500, 1), Step(1000, 10), Step(10000, 100)]
    assert Step(500, 1).label == "500 events/s, one transaction per event"
    assert Step(1000, 10).label == "1,000 events/s, 10 events per transaction"
    for bad in ("", "0", "1000x0", "fast"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_a_round_whose_writer_missed_its_target_by_more_than_5_percent_is_left_out() -> None:
    step = Step(1000, 10)
    rounds = [(step, _round("relay", 10, 960)), (step, _round("relay", 500, 940, r=1)),
              (step, _round("relay", 30, 1000, r=2)), (step, failed("relay", 1000, 10, "boom"))]
    [s] = summarize(rounds)
    assert [x.round for x in s.counted] == [0, 2]
    assert s.median("p99_ms") == 20 and s.span("p99_ms") == (10, 30)
    [everything] = summarize(rounds, strict=False)  # an A/B compares code: every round that ran counts
    assert everything.median("p99_ms") == 30
    table = "\n".join(format_rounds(rounds))
    assert table.count("WRITER MISSED") == 1 and "FAILED: boom" in table


def _report(latency: list[tuple[Step, Latency]]) -> Report:
    return Report(params={"host": {"cpus": 2}, "relay_source": "x", "command": "c", "events": 1, "payload_bytes": 1,
                          "latency_rounds": 2}, latency=latency)


def test_latency_goals_compare_the_relay_with_the_best_peer_at_each_step() -> None:
    one, ten = Step(1000, 10), Step(10000, 100)
    found = {g["goal"].split(" (")[0]: g for g in goals(_report([
        (one, _round("relay", 40, 1000, own_p99=8.0)), (one, _round("relay", 60, 1000, own_p99=12.0, r=1)),
        (one, _round("MongoDB Kafka source connector", 200, 1000)),
        (one, _round("Debezium MongoDB + outbox router", 600, 1000)),
        (ten, _round("relay", 50, 5000, target=10000)), (ten, _round("MongoDB Kafka source connector", 90, 10000,
                                                                      target=10000)),
    ]))}
    best = found["p99 at 1,000 events/s, 10 events per transaction / best peer's"]
    assert best["value"] == pytest.approx(50 / 200) and best["met"] is True
    assert found["relay's own share p99 at 1,000 events/s, 10 events per transaction"]["value"] == 10.0
    missed = next(g for g in found.values() if "10,000 events/s" in g["goal"])
    assert missed["met"] is None and "writer missed its target in every round" in missed["goal"]
    text = "\n".join(format_goals(list(found.values())))
    assert "issues 37, 45, 51 and 53" in text and "not measured" in text


def test_the_report_prints_every_step_and_every_round() -> None:
    one = Step(1000, 10)
    text = format_report(_report([(one, _round("relay", 40, 1000)), (one, _round("relay", 50, 1000, r=1))]))
    assert "steady state, 1,000 events/s, 10 events per transaction: 2 round(s)" in text
    assert "steady-state rounds, as measured" in text and "goals (issues 37, 45, 51 and 53" in text


class _Message:
    def __init__(self, created_ms: int, latency_s: float) -> None:
        self._created, self._latency = created_ms, latency_s

    def timestamp(self) -> tuple[int, int]:
        return 1, self._created

    def latency(self) -> float:
        return self._latency


class _Parcel:
    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages


def test_the_tail_tool_splits_a_parcel_into_its_parts_and_names_what_the_tail_waits_for() -> None:
    timed, messages = Timed(), ["m1", "m2"]
    timed.recording = True
    # Read at 99.0; created (send start) at 100.0, sent by 100.002; the last ack reached
    # librdkafka at 100.050 (produced at 100.002, 48 ms); its report was served at 100.080;
    # the loop went on at 100.081.
    timed.sent(messages, 100.0, 100.002)
    parcel = _Parcel(messages)
    timed.report(parcel, _Message(100_001, 0.040), served=100.060)  # type: ignore[arg-type]
    timed.report(parcel, _Message(100_002, 0.048), served=100.080)  # type: ignore[arg-type]
    timed.delivered(messages, seconds=0.081, read_seconds=1.081, done=100.081)
    [sample] = timed.samples
    assert sample.own == pytest.approx(1081.0)
    expected = {"before": 1000.0, "send": 2.0, "ack": 48.0, "report": 30.0, "notice": 1.0}
    assert sample.parts == pytest.approx(expected)
    lines = summary([Sample(1, 5.0, dict.fromkeys(expected, 1.0)), sample], "t")
    assert "the tail waits for: before" in lines[-1]

"""The fair catch-up's own logic (no servers): the backlog sized by drain time, timing from the first
delivered event to the last with start-up apart, the rotated order, the same backlog for every
contestant of a round, and the goals of issue 45. Timings are never asserted."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

from bench.common import Row
from bench.events import Variant
from bench.goals import goals
from bench.report import Report
from bench.scenarios import fair
from bench.scenarios.drain import CpuAtFirst, Span, rate_of, span_of
from bench.scenarios.fair import Contestant, Field, backlog_events, format_fair, next_backlog, rotated

VARIANT = Variant("default", "200 B generic", 200, False, 100)


def test_the_backlog_lets_the_fastest_contestant_drain_for_the_target_with_a_margin() -> None:
    assert backlog_events([10_000.0, 40_000.0], drain_s=15) == 720_000          # 40,000/s x 15 s x 1.2
    assert backlog_events([33_333.0], drain_s=15, margin=1.0) == 500_000        # rounded up to 1,000
    assert backlog_events([math.nan, 0.0, 50.0], drain_s=1) == 1000             # never below one step
    with pytest.raises(ValueError, match="no rate"):
        backlog_events([math.nan, -1.0], drain_s=15)


def _drained(seconds: float, events_per_s: float, error: str | None = None) -> Row:
    return Row("x", int(seconds * events_per_s), seconds, events_per_s, error=error)


def test_a_round_with_a_short_drain_sizes_the_next_by_its_fastest_rate_and_never_shrinks() -> None:
    long_enough = [_drained(16, 20_000), _drained(30, 10_000)]
    assert next_backlog(320_000, long_enough, drain_s=15) == 320_000
    one_short = [_drained(16, 20_000), _drained(8, 40_000)]
    assert next_backlog(320_000, one_short, drain_s=15) == 720_000
    failed_short = [_drained(16, 20_000), _drained(1, 90_000, error="boom")]   # a failure sizes nothing
    assert next_backlog(320_000, failed_short, drain_s=15) == 320_000
    slow_but_short = [_drained(10, 1_000)]
    assert next_backlog(320_000, slow_but_short, drain_s=15) == 320_000      # never smaller


def test_every_contestant_goes_first_once_in_as_many_rounds_and_keeps_its_neighbours() -> None:
    field = ["a", "b", "c"]
    orders = [rotated(field, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert rotated(field, 4) == rotated(field, 1) and rotated([], 2) == []


def test_a_topic_is_timed_from_its_earliest_first_message_to_its_latest_last_one() -> None:
    span = span_of(100.0, {0: (103.0, 110.0), 1: (102.5, 118.0), 2: (104.0, 117.0)})
    assert (span.first, span.last) == (102.5, 118.0)
    assert span.drain_s == pytest.approx(15.5) and span.start_up_s == pytest.approx(2.5)
    assert rate_of(31_000, span) == pytest.approx(2000.0)   # start-up is not in the rate
    assert math.isnan(rate_of(10, Span(0.0, 5.0, 5.0)))
    with pytest.raises(ValueError, match="no partition"):
        span_of(0.0, {})


class _Client:
    """Stands in for MongoClient: the databases the harness drops."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def drop_database(self, name: str) -> None:
        self.dropped.append(name)


class _Backlog:
    def __init__(self, database: str, events: int) -> None:
        self.database, self.events = database, events


def _contestant(name: str, events_per_s: float, log: list[tuple[str, int]]) -> Contestant:
    def run(backlog: Any, _rid: str) -> Row:
        log.append((name, backlog.events))
        return Row(name, backlog.events, backlog.events / events_per_s, events_per_s)

    return Contestant(name, run)


def test_rounds_give_every_contestant_the_same_backlog_in_a_rotated_order(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[int] = []

    def write_backlog(_client: Any, database: str, _variant: Any, events: int) -> _Backlog:
        written.append(events)
        return _Backlog(database, events)

    monkeypatch.setattr(fair, "write_backlog", write_backlog)
    monkeypatch.setattr(fair, "wait_idle", lambda _stack: 0.0)
    log: list[tuple[str, int]] = []
    entrants = [_contestant("relay", 10_000, log), _contestant("baseline: bare change stream", 20_000, log),
                _contestant("peer: X", 5_000, log)]
    client = _Client()
    out = fair.fair_catch_up(None, client, VARIANT, "run", 3, entrants, drain_s=2.0,  # type: ignore[arg-type]
                             probe_events=1000)
    calibration, rounds = log[:2], log[2:]
    assert [name for name, _ in calibration] == ["relay", "baseline: bare change stream"]   # the probes
    assert out.backlogs == [48_000] * 3                      # 20,000/s x 2 s x 1.2, every round
    assert [name for name, _ in rounds] == ["relay", "baseline: bare change stream", "peer: X",
                                            "baseline: bare change stream", "peer: X", "relay",
                                            "peer: X", "relay", "baseline: bare change stream"]
    assert {events for _, events in rounds} == {48_000}
    assert len(client.dropped) == len(written) == 11         # every backlog's database dropped
    assert all(len(c.rows) == 3 and [r.extra["round"] for r in c.rows] == [0, 1, 2] for c in entrants)


def test_a_contestant_that_drained_too_briefly_is_marked_short() -> None:
    relay = Contestant("relay", lambda b, r: Row("relay", 0, 0, 0))
    relay.rows = [Row("relay", 30_000, 15.0, 2000.0, extra={"start_up_s": 1.0}),
                  Row("relay", 30_000, 12.0, 2500.0, extra={"start_up_s": 1.0})]
    stream = Contestant("baseline: bare change stream", relay.run)
    stream.rows = [Row("s", 30_000, 16.0, 1875.0, extra={"start_up_s": 0.3})]
    text = "\n".join(format_fair(Field([relay, stream], drain_s=15.0, backlogs=[30_000, 30_000]), 2))
    relay_line = next(line for line in text.splitlines() if line.startswith("relay "))
    stream_line = next(line for line in text.splitlines() if line.startswith("baseline: bare change stream"))
    assert "SHORT: 1 round(s) under 15 s" in relay_line and "SHORT" not in stream_line
    assert "30,000, 30,000" in text


def _contestant_with(name: str, *rates: float) -> Contestant:
    c = Contestant(name, lambda b, r: Row(name, 0, 0, 0))
    c.rows = [Row(name, 1000, 1000 / x, x) for x in rates]
    return c


def test_goals_of_issue_45_compare_medians_with_the_tuned_peers_and_the_bare_stream() -> None:
    field = [_contestant_with("relay", 30_000, 31_000, 29_000),
             _contestant_with("relay, exactly-once", 29_000, 28_000, 30_000),
             _contestant_with("baseline: bare relay", 32_000, 32_000, 32_000),
             _contestant_with("baseline: bare change stream", 40_000, 40_000, 40_000),
             _contestant_with("peer: MongoDB connector", 1_000, 1_000, 1_000),          # untuned: not the goal
             _contestant_with("peer: MongoDB connector (tuned)", 20_000, 20_000, 20_000),
             _contestant_with("peer: Debezium (tuned)", 9_000, 9_000, 10_000)]
    found = {g["goal"]: g for g in goals(Report(params={}, fair=field))}
    assert found["catch-up / MongoDB connector (tuned)"]["value"] == pytest.approx(1.5)
    assert found["catch-up / MongoDB connector (tuned)"]["met"] is False               # goal 2x
    assert found["catch-up / Debezium (tuned)"]["met"] is True                         # 30,000 / 9,000 >= 3
    assert found["catch-up / bare change stream (the read limit)"]["met"] is False     # 0.75 < 0.9
    assert found["exactly-once / at-least-once"]["met"] is True                        # 29,000 / 30,000
    assert found["catch-up / bare relay (200 B)"]["met"] is True                       # 0.94 >= 0.9


def test_cpu_per_event_counts_from_the_first_delivered_event() -> None:
    delivered = [0]
    at_first = CpuAtFirst(lambda: os.getpid(), lambda: delivered[0])
    at_first.poll()
    assert at_first.cpu_s is None                        # nothing delivered yet: start-up still running
    delivered[0] = 1
    at_first.poll()
    seen = at_first.cpu_s
    assert seen is not None and seen > 0
    at_first.poll()
    assert at_first.cpu_s == seen                        # taken once, at the first event
    assert at_first.per_event_us(seen + 0.5, 1000) == pytest.approx(500.0)
    assert math.isnan(CpuAtFirst(lambda: None, lambda: 0).per_event_us(1.0, 1000))

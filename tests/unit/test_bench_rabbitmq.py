"""The RabbitMQ part of the benchmark (issue 53), its own logic with no servers: the command's
selection, the RabbitMQ field's calibration, table and goals, latency beside Kafka and NATS, the
span from a queue's depth, the names. Timings are never asserted."""

from __future__ import annotations

from typing import Any

import pytest

from bench.common import Row
from bench.events import Variant
from bench.goals import goals
from bench.rabbitmq import amqp_name, span_of_changes
from bench.report import Report, format_report
from bench.scenarios import fair
from bench.scenarios.fair import Contestant, format_fair, rabbitmq_field
from bench.scenarios.latency import Latency, failed
from bench.scenarios.steady import Step, format_steady, summarize

VARIANT = Variant("default", "200 B generic", 200, False, 100)
PARAMS = {"host": {"cpus": 2}, "relay_source": "x", "command": "c", "events": 1, "payload_bytes": 200,
          "rounds": 3, "rabbitmq": {"rabbitmq_server": "3.10.8", "pika": "1.4.4"}, "only_rabbitmq": True}


def test_only_rabbitmq_runs_the_steps_of_issue_53_beside_kafka_and_nats_unless_told_otherwise() -> None:
    from bench.run import brokers, parse_args

    only = parse_args(["--only-rabbitmq"])
    assert only.only_rabbitmq and only.rabbitmq and only.nats
    assert [(s.rate, s.batch) for s in only.rates] == [(500, 1), (1000, 10)]
    assert brokers(only) == (True, True)                                   # latency beside NATS too
    assert brokers(parse_args(["--only-rabbitmq", "--no-nats"])) == (False, True)
    assert brokers(parse_args(["--only-rabbitmq", "--only-equal-terms"])) == (False, True)
    assert brokers(parse_args(["--only-nats"])) == (True, False)
    assert brokers(parse_args([])) == (True, True) and len(parse_args([]).rates) == 3
    assert brokers(parse_args(["--no-rabbitmq"])) == (True, False)


@pytest.mark.parametrize("conflict", [["--no-rabbitmq"], ["--only-inbox"], ["--only-partitions"], ["--only-nats"]])
def test_only_rabbitmq_refuses_what_contradicts_it(conflict: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from bench.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--only-rabbitmq", *conflict])
    assert "--only-rabbitmq cannot go with" in capsys.readouterr().err


class _Client:
    def drop_database(self, name: str) -> None:
        pass


class _Backlog:
    def __init__(self, database: str, events: int) -> None:
        self.database, self.events = database, events


def test_the_rabbitmq_field_is_calibrated_by_its_own_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fair, "write_backlog", lambda _c, database, _v, events: _Backlog(database, events))
    monkeypatch.setattr(fair, "wait_idle", lambda _stack: 0.0)
    ran: list[str] = []

    def contestant(name: str, events_per_s: float) -> Contestant:
        def run(backlog: Any, _rid: str) -> Row:
            ran.append(name)
            return Row(name, backlog.events, backlog.events / events_per_s, events_per_s)
        return Contestant(name, run)

    entrants = [contestant("relay to RabbitMQ", 4_000), contestant("baseline: bare relay to RabbitMQ", 3_500),
                contestant("relay to Kafka (reference)", 20_000)]
    out = fair.fair_catch_up(None, _Client(), VARIANT, "run", 1, rabbitmq_field(entrants, 2.0),  # type: ignore[arg-type]
                             drain_s=2.0, probe_events=1000)
    assert ran[:3] == ["relay to RabbitMQ", "baseline: bare relay to RabbitMQ", "relay to Kafka (reference)"]
    assert out.backlogs == [48_000]                  # the fastest probe (20,000/s) x 2 s x 1.2
    assert out.reference == "relay to RabbitMQ" and out.broker_role == "rabbitmq"


def _with(name: str, rates: list[float], cpu: float = 100.0, rabbit_cpu: float = 90.0) -> Contestant:
    c = Contestant(name, lambda b, r: Row(name, 0, 0, 0))
    c.rows = [Row(name, 1000, 1000 / x, x, cpu_us_per_event=cpu, mongod_cpu_us_per_event=30.0, peak_rss_mb=66.0,
                  extra={"start_up_s": 1.0, "rabbitmq_cpu_us_per_event": rabbit_cpu}) for x in rates]
    return c


def _report(bare: list[float]) -> Report:
    entrants = [_with("relay to RabbitMQ", [3_800, 4_000, 4_200], cpu=150.0),
                _with("baseline: bare relay to RabbitMQ", bare, cpu=120.0),
                _with("relay to Kafka (reference)", [19_000, 20_000, 21_000], cpu=50.0, rabbit_cpu=0.0)]
    return Report(params=PARAMS, rabbitmq_fair=rabbitmq_field(entrants, 15.0))


def test_the_goal_of_issue_53_is_the_relay_to_rabbitmq_against_its_bare_relay() -> None:
    found = {g["goal"]: g for g in goals(_report(bare=[4_000, 4_500, 5_000]))}
    ratio = found["RabbitMQ: relay to RabbitMQ / bare relay to RabbitMQ"]
    assert ratio["value"] == pytest.approx(4_000 / 4_500) and ratio["met"] is False and ratio["target"] == 0.9
    assert found["RabbitMQ: relay to RabbitMQ / relay to Kafka, catch-up (no target)"]["value"] == pytest.approx(0.2)
    assert found["RabbitMQ: relay to RabbitMQ / relay to Kafka, CPU per event (no target)"]["value"] == pytest.approx(3.0)
    assert not any("MongoDB" in g or "Debezium" in g for g in found)
    assert found["RabbitMQ: relay to RabbitMQ / bare relay to RabbitMQ"]["met"] is not None
    assert {g["goal"]: g for g in goals(_report(bare=[]))}[
        "RabbitMQ: relay to RabbitMQ / bare relay to RabbitMQ"]["met"] is None   # never ran: not measured


def test_the_rabbitmq_table_compares_with_the_relay_to_rabbitmq_and_shows_the_nodes_cpu() -> None:
    report = _report(bare=[4_000, 4_000, 4_100])
    report.rabbitmq_fair.backlogs = [60_000] * 3
    lines = format_fair(report.rabbitmq_fair, 3)
    assert lines[0].startswith("RabbitMQ (issue 53): catch-up on equal terms") and "rabbitmq µs/ev" in lines[1]
    bare = next(line for line in lines if line.startswith("baseline: bare relay to RabbitMQ"))
    assert " 1.00 " in bare                                 # relay/it: 4,000 / 4,000
    assert "the queue's depth" in lines[-1] and "the median of relay to RabbitMQ" in lines[-1]
    text = format_report(report)
    assert "rabbitmq-server 3.10.8, pika 1.4.4" in text and "RabbitMQ only (issue 53)" in text
    assert "goals (issues 37, 45, 51 and 53" in text


def _latency(contender: str, p99: float) -> Latency:
    x = failed(contender, 1000, 10, "")
    x.error, x.achieved_rate, x.p50_ms, x.p99_ms = None, 1000.0, p99 / 4, p99
    return x


def test_latency_of_the_relay_to_rabbitmq_is_reported_beside_kafka_and_nats() -> None:
    step = Step(1000, 10)
    results = [(step, _latency("relay", 20.0)), (step, _latency("relay to NATS", 30.0)),
               (step, _latency("relay to RabbitMQ", 50.0))]
    found = {g["goal"]: g for g in goals(Report(params=PARAMS, latency=results))}
    rabbit = next(g for name, g in found.items() if name.startswith("RabbitMQ: p99 at 1,000 events/s"))
    assert rabbit["value"] == pytest.approx(2.5) and rabbit["met"] is None
    assert "relay to RabbitMQ 50 ms / on Kafka 20 ms / to NATS 30 ms" in rabbit["goal"]
    assert "live consumer of its quorum queue" in "\n".join(format_steady(summarize(results), 1))


def test_a_queues_span_runs_from_its_first_message_to_the_depth_it_ended_at() -> None:
    changes = [(10.0, 3), (10.5, 700), (12.25, 1000), (13.0, 0)]  # drained by someone after: not the end
    span = span_of_changes(changes, 1000, launched=9.0)
    assert (span.first, span.last, span.start_up_s, span.drain_s) == (10.0, 12.25, 1.0, 2.25)
    with pytest.raises(ValueError):
        span_of_changes([], 0, 9.0, "q")


def test_exchange_and_queue_names_hold_only_what_amqp_takes() -> None:
    assert amqp_name("bench", "ab12r0cd", "rabbitmq-catchup-default", "x y/z") == \
        "bench.ab12r0cd.rabbitmq-catchup-default.x_y_z"
    assert len(amqp_name("x" * 300)) == 255

"""The benchmark harness's own logic (no servers): process sampling, the writer's schedule,
the goals it reports and the BENCHMARKS.md section it rewrites. Timings are never asserted."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from bench.common import Row
from bench.events import EventFactory, variants
from bench.report import MARK_END, MARK_START, Report, format_report, goals, update_benchmarks_md
from bench.sampling import Sampler
from bench.writer import RateWriter
from tests.support.paths import ROOT

# A parent that starts a child which holds 64 MB and burns about 0.6 s of CPU; the parent itself
# only waits. Both print nothing; the parent exits when the child does.
_TREE = textwrap.dedent("""
    import subprocess, sys
    child = '''
    import time
    block = bytearray(64 * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    '''
    subprocess.run([sys.executable, '-c', child], check=True)
""")


def _sample_tree(trees: frozenset[str]) -> Any:
    parent = subprocess.Popen([sys.executable, "-c", _TREE])
    try:
        with Sampler(lambda: {"parent": parent.pid}, trees=trees, interval_s=0.01) as sampler:
            parent.wait(timeout=60)
        return sampler.stop()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_sampler_counts_a_process_trees_cpu_and_peak_rss_children_included() -> None:
    usage = _sample_tree(frozenset({"parent"}))
    assert usage.cpu_s["parent"] >= 0.4, usage
    assert usage.peak_rss_mb["parent"] >= 64, usage


def test_sampler_without_tree_counts_only_the_process_itself() -> None:
    usage = _sample_tree(frozenset())
    assert usage.cpu_s["parent"] < 0.4, usage
    assert usage.peak_rss_mb["parent"] < 64, usage


class _FakeOutbox:
    """Records what the writer sends; stands in for `relay.outbox.Outbox` (no server)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def add(self, event: Any) -> None:
        with self._lock:
            self.calls.append([event.id_str])

    def add_many(self, events: list[Any], session: Any = None) -> list[Any]:
        with self._lock:
            self.calls.append([e.id_str for e in events])
        return [e.id_str for e in events]


@pytest.mark.parametrize("batch", [1, 7])
def test_rate_writer_writes_every_scheduled_event_once_in_batches(batch: int) -> None:
    outbox = _FakeOutbox()
    writer = RateWriter(outbox, EventFactory(64), rate_per_s=2000, seconds=0.05, batch=batch)  # type: ignore[arg-type]
    writer.run()
    ids = [i for call in outbox.calls for i in call]
    assert len(ids) == writer.total == 100
    assert len(set(ids)) == 100 and set(ids) == set(writer.committed)
    assert all(len(call) <= batch for call in outbox.calls)
    assert sum(1 for call in outbox.calls if len(call) == batch) >= 100 // batch


def test_variants_shrink_the_backlog_as_payloads_grow_and_include_a_typed_one() -> None:
    found = {v.key: v for v in variants(100_000, 200, sizes=True, typed=True)}
    assert [found[k].events for k in ("default", "2kb", "20kb", "typed")] == [100_000, 50_000, 20_000, 100_000]
    typed = found["typed"].factory().event(3)
    assert typed.event_type == "OrderCreated" and set(typed.payload) == {"orderId", "amount", "step"}


def _row(name: str, events_per_s: float, error: str | None = None) -> Row:
    return Row(name, 100, 1.0, events_per_s, variant="default", error=error)


def test_goals_compare_the_relay_with_each_peer_in_the_same_run() -> None:
    report = Report(params={}, rows=[
        _row("relay catch-up (to checkpoint)", 10_000),
        _row("peer: MongoDB Kafka source connector", 4_000),
        _row("peer: Debezium MongoDB + outbox router", 4_000),
        _row("baseline: bare relay", 20_000, error="failed"),
    ])
    found = {g["goal"]: g for g in goals(report)}
    assert found["catch-up / MongoDB Kafka source connector"]["met"] is True
    assert found["catch-up / Debezium"]["met"] is False          # 2.5x, the goal is 3x
    assert found["catch-up / bare relay"]["met"] is None          # a failed row is not a figure
    assert math.isnan(found["catch-up / bare relay"]["value"])


def test_benchmarks_md_section_is_replaced_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(f"# Benchmarks\nbefore\n{MARK_START}\nold run\n{MARK_END}\nafter\n")
    report = Report(params={"command": "python -m bench.run", "relay_source": "abc1234 (/x)",
                            "started_at": "2026-01-01T00:00:00+00:00", "wall_seconds": 61.0})
    update_benchmarks_md(report, "the table", path)
    text = path.read_text()
    assert text.startswith("# Benchmarks\nbefore\n") and text.endswith(f"{MARK_END}\nafter\n")
    assert "old run" not in text and "the table" in text and "abc1234" in text
    path.write_text("# no markers\n")
    with pytest.raises(RuntimeError, match="bench-latest"):
        update_benchmarks_md(report, "the table", path)


def test_partition_table_compares_each_group_with_one_relay_at_one_partition() -> None:
    def group(partitions: int, processes: int, events_per_s: float, per_process: list[float]) -> Row:
        return Row(f"{processes} relay processes, {partitions} partitions", 200_000, 200_000 / events_per_s,
                   events_per_s, kind="partitions", cpu_us_per_event=sum(per_process), mongod_cpu_us_per_event=20.0,
                   extra={"partitions": partitions, "processes": processes, "drain_s": 10.0,
                          "cpu_us_per_event_per_process": per_process})

    def streams(k: int, mongod: float) -> Row:
        return Row(f"{k} change streams", 200_000, 1.0, 200_000, kind="streams", mongod_cpu_us_per_event=mongod,
                   extra={"streams": k})

    report = Report(params={"host": {"cpus": 2}, "relay_source": "x", "command": "c", "partition_events": 200_000},
                    partition_rows=[group(1, 1, 5_000, [120.0]), group(4, 2, 7_500, [60.0, 50.0]),
                                    streams(1, 17.0), streams(4, 68.0)])
    text = format_report(report)
    lines = {line.split("  ")[0].strip(): line for line in text.splitlines()}
    assert "partitioned outbox only: partition-events=200000" in text
    assert "1.50" in lines["2 relay processes, 4 partitions"] and " 110 " in lines["2 relay processes, 4 partitions"]
    four = next(line for line in text.splitlines() if line.strip().startswith("4 ") and "68.0" in line)
    assert "17.0" in four and "4.00" in four, four  # per stream, and 4x one stream
    assert "issue 15 goals" not in text and "every row" not in text


def test_own_share_quantiles_come_from_the_buckets_observed_between_two_readings() -> None:
    from bench.scenarios.latency import histogram_quantile

    before = [(0.001, 5.0), (0.005, 5.0), (0.01, 5.0), (math.inf, 5.0)]
    # 100 new observations: 50 in (0, 1 ms], 40 in (1, 5 ms], 10 in (5, 10 ms].
    after = [(0.001, 55.0), (0.005, 95.0), (0.01, 105.0), (math.inf, 105.0)]
    assert histogram_quantile(0.5, before, after) == pytest.approx(0.001)
    assert histogram_quantile(0.99, before, after) == pytest.approx(0.005 + 0.005 * 0.9)
    assert math.isnan(histogram_quantile(0.5, before, before))
    # Beyond the last finite bound all one can say is that bound.
    assert histogram_quantile(0.99, before, [(0.001, 5.0), (0.005, 5.0), (0.01, 5.0), (math.inf, 15.0)]) == 0.01


def test_peer_messages_are_matched_to_events_by_their_id() -> None:
    from bench.scenarios.latency import peer_event_id

    class _Message:
        def __init__(self, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> None:
            self._value, self._headers = value, headers

        def value(self) -> bytes:
            return self._value

        def headers(self) -> list[tuple[str, bytes]] | None:
            return self._headers

    oid = "6b05e352d597e0f1f1ebd3f5"
    mongo = _Message(b'{"_id": {"$oid": "' + oid.encode() + b'"}, "payload": {"ref": "' + b"a" * 24 + b'"}}')
    debezium = _Message(b'{"ref": "' + b"b" * 24 + b'"}', [("id", b'"' + oid.encode() + b'"'), ("eventType", b"x")])
    assert peer_event_id(mongo) == peer_event_id(debezium) == oid  # type: ignore[arg-type]


def test_the_service_like_writer_commits_events_with_their_business_documents() -> None:
    outbox, business = _FakeOutbox(), _FakeBusiness()
    writer = RateWriter(outbox, EventFactory(64), rate_per_s=2000, seconds=0.02, batch=1,  # type: ignore[arg-type]
                        business=business)  # type: ignore[arg-type]
    writer.run()
    assert business.transactions == len(outbox.calls) == writer.total == 40
    assert len(writer.behind) == 40 and all(b >= 0 for b in writer.behind)


class _FakeBusiness:
    """A collection whose client's sessions run each transaction once (no server)."""

    def __init__(self) -> None:
        self.transactions = 0
        self.database = self
        self.client = self
        self._lock = threading.Lock()

    def start_session(self) -> Any:
        outer = self

        class _Session:
            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def with_transaction(self, callback: Any) -> None:
                callback(self)
                with outer._lock:
                    outer.transactions += 1

        return _Session()

    def insert_many(self, docs: list[Any], session: Any = None) -> None:
        assert session is not None, "business documents are written in the transaction"


def test_the_inbox_scenario_runs_from_bench_run_and_reports_both_ratios():
    from bench.run import parse_args

    args = parse_args(["--only-inbox", "--inbox-events", "500"])
    assert (args.inbox, args.only_inbox, args.inbox_events, args.inbox_rounds) == (True, True, 500, 3)
    assert parse_args([]).inbox and not parse_args(["--no-inbox"]).inbox
    result = {"events": 500, "per_event_events": 500, "rounds": 3, "batch": 500,
              "runs": {"inbox": [90.0, 100.0, 110.0], "bare, one transaction per batch": [100.0] * 3,
                       "bare, one transaction per event": [10.0] * 3},
              "events_per_s": {"inbox": 100.0, "bare, one transaction per batch": 100.0,
                               "bare, one transaction per event": 10.0},
              "inbox_vs_batched": 1.0, "inbox_vs_per_event": 10.0, "load_average": [[1.0] * 3, [2.0] * 3]}
    text = format_report(Report(params={"host": {"cpus": 2}, "relay_source": "x", "command": "c",
                                        "inbox_events": 500}, inbox=result))
    assert "inbox only" in text and "rounds: 90, 100, 110" in text
    assert "inbox / bare batched   = 1.00" in text and "inbox / bare per event = 10.0x" in text


@pytest.mark.parametrize("module", sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                                          for p in (ROOT / "bench").rglob("*.py") if p.name != "__main__.py"))
def test_every_bench_module_imports(module: str) -> None:
    """A module that only a rarely run command imports (bench.timeline, for `bench.profile --where`)
    still follows the relay's renames."""
    importlib.import_module(module)

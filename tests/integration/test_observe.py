"""Operating the relay: /metrics scraped over HTTP, /livez and /readyz, log lines, the summary.

Everything runs against the real servers of the session: `outbox-relay run` as a child process
(RelayProcess) serves HTTP on a free port exactly as in a container; in-process relays
(RelayThread) are used where a test needs to reach into the loop (a stuck loop, the summary).
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from relay.config import Settings
from relay.core.errors import ConfigError
from relay.dev.stack import free_port
from relay.ops.logs import JsonFormatter, resolve_log_format
from relay.ops.metrics import BatchHistograms
from relay.ops.observe import ProcessObserver
from tests.static.support import DOCKERFILE
from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered
from tests.support.paths import ROOT
from tests.support.relays import RelayProcess, RelayThread
from tests.support.servers import needs_local_stack
from tests.support.topics import read_messages, read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import write_events

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# ---- HTTP helpers ------------------------------------------------------------------------------

def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _health(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = _get(port, path)
    return status, json.loads(body)


def _answers(port: int) -> bool:
    try:
        return _get(port, "/livez")[0] in (200, 503)
    except OSError:
        return False


def _scrape(port: int) -> tuple[Samples, str]:
    status, body = _get(port, "/metrics")
    assert status == 200
    text = body.decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, text


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of `name`'s series whose labels include `labels` (None when there is none): a
    series also carries the `outbox` label, which these tests of one outbox leave out."""
    wanted = set(labels.items())
    found = [v for (n, series), v in samples.items() if n == name and wanted <= set(series)]
    return sum(found) if found else None


def _series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def _serving(settings: Settings, tmp_path: Path, name: str, **extra_env: str) -> tuple[RelayProcess, int]:
    """`outbox-relay run` on a free HTTP port, started; returns it once /livez answers."""
    port = free_port()
    relay = RelayProcess(settings.replace(http_port=port), tmp_path, name, extra_env).start()
    try:
        wait_until(lambda: _answers(port) or not relay.alive, 60, f"{name} to serve HTTP")
    except AssertionError:
        relay.stop()
        raise
    assert relay.alive, relay.log()
    return relay, port


# ---- /metrics ------------------------------------------------------------------------------------

def test_metrics_scraped_over_http_match_what_kafka_holds(env, tmp_path):
    bootstrap = env.servers.kafka_bootstrap
    written = write_events(env.db, env.settings.outbox_collection, total=300, writers=3)
    relay, port = _serving(env.settings, tmp_path, "relay")
    try:
        wait_until(lambda: _health(port, "/readyz")[0] == 200, 60, "/readyz to turn ready")
        # The invoices are written only once the orders are acknowledged, so they cannot share the
        # orders' batch: at least two batches, whatever the timing of the relay's first read.
        wait_until(lambda: topic_size(bootstrap, env.topic("order")) >= 300, 60, "300 orders in Kafka")
        invoices = write_events(env.db, env.settings.outbox_collection, total=120, writers=2, seed=2,
                                aggregate_type="invoice")
        topics = {env.topic("order"): 300, env.topic("invoice"): 120}
        wait_until(lambda: all(topic_size(bootstrap, t) >= n for t, n in topics.items()), 60, "420 events in Kafka")
        wait_until(lambda: sum(_series(_scrape(port)[0], "relay_events_published_total").values()) >= 420, 30,
                   "the counters to catch up with the acknowledgements")
        samples, text = _scrape(port)

        for topic, count in topics.items():
            assert _value(samples, "relay_events_published_total", topic=topic) == count == topic_size(bootstrap, topic)
            assert _value(samples, "relay_bytes_published_total", topic=topic) == sum(len(m.value()) for m in read_messages(bootstrap, topic))
        batches = _value(samples, "relay_batches_total")
        assert batches is not None and 2 <= batches <= 420
        assert _value(samples, "relay_batch_seconds_count") == batches
        # Delivery latency: one observation per event, commit (wallTime) to acknowledgement.
        assert _value(samples, "relay_delivery_latency_seconds_count") == 420
        assert _value(samples, "relay_delivery_latency_seconds_bucket", le="+Inf") == 420
        assert (_value(samples, "relay_delivery_latency_seconds_sum") or 0) > 0
        # The lease and the checkpoint, as stored in MongoDB.
        doc = lease_doc(env.db, env.settings)
        assert _value(samples, "relay_lease_held") == 1
        assert _value(samples, "relay_fencing_token") == doc["fencingToken"] == 1
        wait_until(lambda: _value(_scrape(port)[0], "relay_checkpoint_cluster_time_seconds")
                   == lease_doc(env.db, env.settings)["tokenClusterTime"].time, 30,
                   "the checkpoint time to equal the stored one")
        # The lag is "now minus the checkpoint's cluster time": at most the time since the
        # checkpoint read just before the scrape (the relay's own can only be newer).
        stored = lease_doc(env.db, env.settings)["tokenClusterTime"].time
        lag = _value(_scrape(port)[0], "relay_checkpoint_lag_seconds")
        assert lag is not None and 0 <= lag <= time.time() - stored, lag
        # Nothing went wrong, nothing waits in the producer, and the rest is there.
        assert not any(_series(samples, "relay_errors_total").values())
        assert not any(_series(samples, "relay_restarts_total").values())
        assert _value(samples, "relay_dead_letters_total") == 0
        assert _value(samples, "relay_producer_queue_messages") == 0
        info = _series(samples, "relay_info")
        assert [dict(labels)["replica"] for labels in info] == [env.settings.instance_id]
        assert (_value(samples, "process_resident_memory_bytes") or 0) > 0
        assert "_created" not in text
        assert _health(port, "/livez") == (200, {"ok": True, "role": "leader",
                                                  "lastTurnSecondsAgo": pytest.approx(0, abs=5)})
        outbox = str(env.namespace)
        assert _health(port, "/readyz") == (200, {"ok": True, "role": "leader", "reason": "leader",
                                                  "outboxes": {outbox: {"ok": True, "role": "leader"}}})
        assert _get(port, "/nothing-here")[0] == 404
    finally:
        relay.stop()
    assert_complete_and_ordered(read_topic(bootstrap, env.topic("order")), written)
    assert_complete_and_ordered(read_topic(bootstrap, env.topic("invoice")), invoices)


def test_a_standby_replica_is_ready_and_reports_no_lease(env, tmp_path):
    leader, leader_port = _serving(env.settings, tmp_path, "a")
    try:
        wait_until(lambda: _health(leader_port, "/readyz")[1].get("role") == "leader", 60, "A to lead")
        standby, port = _serving(env.settings.replace(instance_id=env.settings.instance_id + "-b"), tmp_path, "b")
        try:
            wait_until(lambda: _health(port, "/readyz")[0] == 200, 60, "B to be a ready standby")
            outbox = str(env.namespace)
            assert _health(port, "/readyz")[1] == {"ok": True, "role": "standby", "reason": "standby",
                                                   "outboxes": {outbox: {"ok": True, "role": "standby"}}}
            samples, _ = _scrape(port)
            assert _value(samples, "relay_lease_held") == 0 and _value(samples, "relay_fencing_token") == 0
            assert _value(samples, "relay_checkpoint_lag_seconds") is None, "only the leader reports the lag"
        finally:
            standby.stop()
    finally:
        leader.stop()


# ---- /readyz and /livez --------------------------------------------------------------------------

def test_readyz_turns_unready_while_mongodb_is_paused_and_ready_again_after(env, tmp_path):
    stack = needs_local_stack(env.servers)
    mongod = stack.mongo.processes[0]
    relay, port = _serving(env.settings, tmp_path, "relay")
    try:
        written = write_events(env.db, env.settings.outbox_collection, total=200, writers=2)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 200, 60, "200 events")
        wait_until(lambda: _health(port, "/readyz")[0] == 200, 30, "/readyz to be ready")
        mongod.pause()
        try:
            wait_until(lambda: _health(port, "/readyz")[0] == 503, 40, "/readyz to turn unready")
            status, body = _health(port, "/readyz")
            assert body["ok"] is False and body["reason"], body
            # A server outage is not a stuck loop: the kubelet must not restart the relay for it.
            assert _health(port, "/livez")[0] == 200
        finally:
            mongod.resume()
        wait_until(lambda: _health(port, "/readyz")[0] == 200, 90, "/readyz to be ready again")
        write_events(env.db, env.settings.outbox_collection, total=200, writers=2, seed=3, written=written)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 400, 60, "400 events")
        assert _health(port, "/readyz")[0] == 200
    finally:
        relay.stop()
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)


def test_readyz_turns_unready_while_kafka_is_paused_and_livez_stays_up(env):
    stack = needs_local_stack(env.servers)
    port = free_port()
    relay = RelayThread(env.settings.replace(http_port=port))
    observer = relay.relay.observer
    observer.health.publish_stall_s = 3.0  # 30 s by default
    server = observer.serve()
    assert server is not None
    broker = stack.kafka.process
    try:
        with relay:
            written = write_events(env.db, env.settings.outbox_collection, total=100, writers=2)
            wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 100, 60, "100 events")
            wait_until(lambda: _health(port, "/readyz")[0] == 200, 30, "ready")
            broker.pause()
            try:
                write_events(env.db, env.settings.outbox_collection, total=100, writers=2, seed=4, written=written)
                wait_until(lambda: _health(port, "/readyz")[0] == 503, 30, "/readyz to report Kafka")
                status, body = _health(port, "/readyz")
                assert "unacknowledged" in body["reason"] and body["role"] == "leader", body
                assert _health(port, "/livez")[0] == 200, "the loop still turns while it waits on Kafka"
                assert (_value(_scrape(port)[0], "relay_producer_queue_messages") or 0) > 0
            finally:
                broker.resume()
            wait_until(lambda: _health(port, "/readyz")[0] == 200, 90, "ready again")
            wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 200, 90, "200 events")
    finally:
        server.shutdown()
        server.server_close()
    assert relay.error is None, relay.error
    assert_complete_and_ordered(read_topic(env.servers.kafka_bootstrap, env.topic()), written)


def _healthcheck_argv() -> list[str]:
    """The Dockerfile's HEALTHCHECK command, with this interpreter as `python`."""
    line = next(row for row in DOCKERFILE.read_text().splitlines() if row.strip().startswith("CMD [\"python\""))
    argv = json.loads(line.strip()[len("CMD "):])
    return [sys.executable, *argv[1:]]


def test_a_stuck_loop_fails_livez_and_the_image_healthcheck_while_http_still_answers(env):
    port = free_port()
    relay = RelayThread(env.settings.replace(http_port=port))
    observer = relay.relay.observer
    observer.health.live_stall_s = observer.health.ready_stall_s = 3.0
    unblock, blocked = threading.Event(), threading.Event()
    [loop] = observer.loops.values()  # what the one outbox's loop reports to
    published = loop.published

    def stuck_then_published(*args: Any) -> None:  # called on the loop thread
        blocked.set()
        unblock.wait(60)
        published(*args)

    server = observer.serve()
    assert server is not None
    healthcheck = _healthcheck_argv()
    environ = {**os.environ, "RELAY_HTTP_PORT": str(port)}
    try:
        with relay:
            try:
                wait_until(lambda: _health(port, "/readyz")[0] == 200, 60, "ready")
                assert subprocess.run(healthcheck, env=environ, timeout=30).returncode == 0
                loop.published = stuck_then_published  # type: ignore[method-assign]
                write_events(env.db, env.settings.outbox_collection, total=5, writers=1)
                wait_until(blocked.is_set, 30, "the loop to block")
                wait_until(lambda: _health(port, "/livez")[0] == 503, 15, "/livez to fail")
                assert _health(port, "/readyz")[0] == 503
                failed = subprocess.run(healthcheck, env=environ, capture_output=True, timeout=30)
                assert failed.returncode != 0 and b"503" in failed.stderr
            finally:
                unblock.set()
            wait_until(lambda: _health(port, "/livez")[0] == 200, 15, "/livez to pass again")
    finally:
        server.shutdown()
        server.server_close()
    assert relay.error is None, relay.error
    gone = subprocess.run(healthcheck, env=environ, capture_output=True, timeout=30)
    assert gone.returncode != 0, "no relay listening: the health check fails"


def test_http_port_in_use_is_a_configuration_error_naming_it():
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            ProcessObserver((parts := Settings().replace(http_port=port).parts()).observer, parts.outboxes).serve()
    assert err.value.setting == "RELAY_HTTP_PORT"


# ---- logs ----------------------------------------------------------------------------------------

def test_json_log_lines_carry_event_id_token_prefix_and_fencing_token(env, tmp_path):
    relay, _ = _serving(env.settings, tmp_path, "relay", RELAY_LOG_LEVEL="DEBUG")
    try:
        write_events(env.db, env.settings.outbox_collection, total=50, writers=1)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 50, 60, "50 events")
        wait_until(lambda: '"published ' in relay.log(), 30, "a line about published events")
    finally:
        assert relay.terminate() == 0
    lines = [json.loads(line) for line in relay.log().splitlines() if line.strip()]  # stderr is a file: JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    ids = {str(d["_id"]) for d in env.outbox.find()}
    about_events = [line for line in lines if line["logger"] == "relay.observe"]
    assert about_events
    for line in about_events:
        assert line["event_id"] in ids and line["first_event_id"] in ids
        assert line["fencing"] == 1 and line["instance"] == env.settings.instance_id
        assert len(line["token"]) >= 8 and all(c in "0123456789ABCDEF…" for c in line["token"]), line
    lease = next(line for line in lines if "holding the lease" in line["message"])
    assert lease["fencing"] == 1
    assert any(line["message"] == "stopped" for line in lines)


def test_summary_line_reports_the_counts_in_text_format(env, logs):
    captured = logs("text")
    relay = RelayThread(env.settings)
    relay.relay.observer.summary_every_s = 0.5
    with relay:
        write_events(env.db, env.settings.outbox_collection, total=60, writers=2)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 60, 60, "60 events")
        wait_until(lambda: "published=60 " in captured.text, 30, "a summary with the 60 events")
    assert relay.error is None, relay.error
    summary = next(line for line in captured.text.splitlines() if "summary: " in line and "published=60 " in line)
    assert "role=leader fencing=1 " in summary and "restarts=0" in summary and "dead_letters=0" in summary
    assert " lag=" in summary and "lag=-" not in summary
    assert "  " in summary and "fencing=1" in summary.split("  ", 1)[1], "the extra fields follow the message"
    assert not summary.lstrip().startswith("{"), "text format"


def test_log_format_auto_is_text_on_a_terminal_and_json_otherwise():
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert resolve_log_format("auto", tty) == "text"
    finally:
        os.close(master)
        os.close(slave)
    assert resolve_log_format("auto", io.StringIO()) == "json"
    assert resolve_log_format("text", io.StringIO()) == "text"
    with pytest.raises(ConfigError) as err:
        Settings.load(env={"RELAY_LOG_FORMAT": "yaml"})
    assert err.value.setting == "RELAY_LOG_FORMAT"


def test_json_formatter_keeps_extra_fields_and_the_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("relay", logging.ERROR, __file__, 1, "event %s failed", ("e1",), sys.exc_info())
    record.event_id, record.fencing = "e1", 7
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "event e1 failed" and line["event_id"] == "e1" and line["fencing"] == 7
    assert "ValueError: boom" in line["exc"] and line["time"].endswith("Z")


# ---- the pieces the hot path relies on -----------------------------------------------------------

def test_wall_time_and_operation_are_read_from_real_raw_change_events(env):
    from relay.core.positions import ClusterTime
    from relay.mongo.codecs import RAW_CHANGE_CODEC, read_changes
    from relay.mongo.pipeline import PIPELINE

    with env.outbox.with_options(codec_options=RAW_CHANGE_CODEC).watch(PIPELINE, max_await_time_ms=500) as stream:
        env.outbox.insert_one({"_id": "w1", "wallTime": "a decoy in the document", "payload": {"wallTime": 1}})
        change = wait_until(stream.try_next, 30, "the change event")
        env.outbox.drop()
        dropped = wait_until(stream.try_next, 30, "the drop event")
    [value], other = read_changes([change, dropped])
    assert other == 1, "the read stops at the drop"
    assert value.wall_ms == int(change["wallTime"].timestamp() * 1000) and value.event_id == "w1"
    assert value.cluster_time == ClusterTime(change["clusterTime"].time, change["clusterTime"].inc)
    assert value.position == dict(change["_id"]) and value.document == change["fullDocument"].raw


def test_batch_histogram_exposes_what_prometheus_histogram_would():
    values = [random.Random(5).expovariate(2.0) for _ in range(2000)] + [0.005, 0.01, 1.0, 700.0]
    buckets = (0.005, 0.01, 0.1, 1.0, 10.0, 600.0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    histogram = BatchHistograms("h_seconds", "h", [], buckets, ours).labels()
    histogram.observe_many(values[:1000])
    histogram.observe_many(values[1000:])
    reference = Histogram("h_seconds", "h", buckets=buckets, registry=theirs)
    for v in values:
        reference.observe(v)

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        return {(s.name, s.labels.get("le", "")): s.value for m in registry.collect() for s in m.samples
                if not s.name.endswith("_created")}

    got, want = samples(ours), samples(theirs)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key]), key


# ---- the compose demo writer ---------------------------------------------------------------------

def test_compose_demo_writer_writes_outbox_events_the_relay_publishes(env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")} | {
        "RELAY_MONGODB_URI": env.servers.mongodb_uri, "RELAY_DATABASE": env.settings.database,
        "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "demo_writer.py"), "--events", "12",
                             "--rate", "200"], env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    count = env.outbox.count_documents({})
    assert count >= 12 and f"{count} events written to {env.namespace}" in result.stdout
    with RelayThread(env.settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= count, 60, "the demo events")
    assert relay.error is None, relay.error

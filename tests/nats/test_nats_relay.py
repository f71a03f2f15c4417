"""The relay on NATS JetStream (RELAY_BROKER=nats; docs/nats.md), against a real nats-server and
mongod: what a message carries, acknowledgement before position, the stream's check at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay.core.errors import ConfigError
from relay.core.message import HEADER_AGGREGATE_ID
from tests.support.leases import lease_doc
from tests.support.nats import add_stream, stream_info
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.waiting import wait_until
from tests.support.writes import write_events


def _published(nenv, written, timeout: float = 60):
    return wait_until(lambda: (r := nenv.read()) and {x.id for x in r} >= written.ids and r, timeout,
                      "every event in the stream", interval=0.5)


def test_events_reach_the_stream_in_commit_order_with_the_kafka_headers_and_the_msg_id(nenv):
    written = write_events(nenv.db, nenv.settings.outbox_collection, total=300, writers=3)
    with RelayThread(nenv.settings) as relay:
        records = _published(nenv, written)
        wait_until(lambda: (lease_doc(nenv.db, nenv.settings) or {}).get("resumeToken"), 30, "a stored checkpoint")
    assert relay.error is None, relay.error
    verdict = assert_complete_and_ordered(records, written)
    assert not verdict.duplicates
    first = records[0]
    assert first.headers["Nats-Msg-Id"] == first.headers["ce_id"] == first.id
    assert first.headers[HEADER_AGGREGATE_ID] == first.headers["ce_subject"] == first.key
    assert first.headers["content-type"] == "application/avro" and first.headers["relay_fencing_token"] == "1"
    assert first.topic == nenv.subject("order")
    info = stream_info(nenv.server.url, nenv.stream)
    assert info.config.subjects == [f"t{nenv.tag}.event.>"] and info.config.duplicate_window == 120


def test_a_stream_the_operator_made_is_used_as_it_is(nenv):
    add_stream(nenv.server.url, nenv.stream, [f"t{nenv.tag}.>"], duplicate_window=300)
    written = write_events(nenv.db, nenv.settings.outbox_collection, total=50, writers=1)
    with RelayThread(nenv.settings) as relay:
        _published(nenv, written)
    assert relay.error is None
    info = stream_info(nenv.server.url, nenv.stream)
    assert info.config.subjects == [f"t{nenv.tag}.>"] and info.config.duplicate_window == 300


def test_a_stream_that_misses_a_subject_stops_the_relay_naming_it(nenv):
    add_stream(nenv.server.url, nenv.stream, [f"t{nenv.tag}.other.>"])
    with RelayThread(nenv.settings) as relay:
        relay.thread.join(timeout=60)
    assert isinstance(relay.error, ConfigError)
    message = str(relay.error)
    assert message.startswith("RELAY_NATS_STREAM:") and f"t{nenv.tag}.event.*" in message
    assert nenv.size() == 0


def test_a_missing_stream_with_creation_off_stops_the_relay_naming_it(nenv):
    with RelayThread(nenv.settings.replace(nats_create_stream=False)) as relay:
        relay.thread.join(timeout=60)
    assert isinstance(relay.error, ConfigError) and "has no stream" in str(relay.error)


@pytest.mark.parametrize("window", [10, 120])
def test_exactly_once_refuses_a_duplicate_window_shorter_than_the_longest_republish(nenv, window):
    add_stream(nenv.server.url, nenv.stream, [f"t{nenv.tag}.>"], duplicate_window=window)
    settings = nenv.settings.replace(delivery="exactly-once")  # 1 s + 4 s + 0.3 s + 5 s = 10.3 s
    written = write_events(nenv.db, nenv.settings.outbox_collection, total=20, writers=1)
    with RelayThread(settings) as relay:
        if window < 10.3:
            relay.thread.join(timeout=60)
        else:
            _published(nenv, written)
    if window < 10.3:
        assert isinstance(relay.error, ConfigError)
        assert "duplicate window (10 s)" in str(relay.error) and "(10.3 s" in str(relay.error)
    else:
        assert relay.error is None


def test_tail_prints_a_subjects_messages_decoded_and_status_names_the_broker_and_the_stream(nenv):
    import io
    import json

    from relay.commands.status import status
    from relay.commands.tail import tail

    written = write_events(nenv.db, nenv.settings.outbox_collection, total=30, writers=1)
    with RelayThread(nenv.settings) as relay:
        _published(nenv, written)
    assert relay.error is None
    out = io.StringIO()
    assert tail(nenv.settings, f"t{nenv.tag}.event.*", last=5, out=out) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 5 and [x["sequence"] for x in lines] == list(range(26, 31))
    last = lines[-1]
    assert last["subject"] == nenv.subject() and last["stream"] == nenv.stream
    assert last["key"] == last["headers"]["relay_aggregate_id"] and last["value"]["id"] == last["headers"]["ce_id"]
    assert last["schema"] == "io.outboxrelay.v1.OutboxEvent"
    out = io.StringIO()
    assert tail(nenv.settings, ">", from_beginning=True, max_messages=7, out=out) == 0
    assert len(out.getvalue().splitlines()) == 7
    assert tail(nenv.settings.replace(nats_stream="NOPE"), ">", out=io.StringIO()) == 2
    shown = status(nenv.settings)
    assert shown["broker"] == {"name": "nats", "servers": nenv.server.url, "stream": nenv.stream}


def test_dev_up_with_nats_evals_to_settings_the_relay_runs_on_and_down_stops_it(tmp_path):
    """`eval "$(outbox-relay dev up --broker nats --format env)"`: MongoDB and nats-server (no
    Kafka, no Java needed), the relay publishing to it with only those variables; `dev down`
    stops both by pid."""
    import os
    import subprocess
    import sys

    from relay.dev.stack import pid_alive
    from tests.support.paths import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env |= {"RELAY_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    (tmp_path / "cache").mkdir()
    for name in ("mongodb-6.0.27", "nats-server-2.15.1"):  # the fetched servers, not fetched again
        os.symlink(Path.home() / ".cache" / "outbox-relay" / name, tmp_path / "cache" / name)
    up = (f'eval "$({sys.executable} -m relay dev up --broker nats --format env)" && '
          'printf "%s\\n" "$RELAY_BROKER" "$RELAY_NATS_SERVERS" "$RELAY_MONGODB_URI" "${RELAY_KAFKA_BOOTSTRAP_SERVERS:-none}"')
    proc = subprocess.run(["bash", "-c", up], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        broker, servers, uri, kafka = proc.stdout.splitlines()
        assert broker == "nats" and servers.startswith("nats://127.0.0.1:") and kafka == "none"
        status = json.loads(subprocess.run([sys.executable, "-m", "relay", "dev", "status", "--format", "json"],
                                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout)
        assert status["running"] and status["broker"] == "nats" and "kafka" not in status
        pids = [*status["mongodb"]["pids"], status["nats"]["pid"]]
    finally:
        down = subprocess.run([sys.executable, "-m", "relay", "dev", "down"], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids if pid_alive(pid)], "dev down stops mongod and nats-server"


def test_the_demo_runs_end_to_end_on_nats(tmp_path):
    import os
    import subprocess
    import sys

    from tests.support.paths import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "relay", "demo", "--broker", "nats", "--events", "40", "--rate", "400"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"written": 40, "delivered": 40}
    assert "shipping service (inbox): 40 events applied" in proc.stdout
    assert "stream OUTBOX holds 40 messages: it dropped every copy" in proc.stderr


def test_nats_unreachable_at_start_says_so_at_once_then_stops_with_one_line_exit_3(nenv, tmp_path):
    import time as clock

    from relay.dev.ports import Ports
    from tests.support.relays import RelayProcess

    [port] = Ports().take([0], "a closed port")  # reserved: nothing listens there
    settings = nenv.settings.replace(nats_servers=f"nats://127.0.0.1:{port}", connect_timeout_s=6.0)
    proc = RelayProcess(settings, tmp_path, "unreachable").start()
    started = clock.monotonic()
    wait_until(lambda: "waiting up to" in proc.log(), 30, "the waiting line")
    assert clock.monotonic() - started < 6 + 5, "said before the timeout"
    wait_until(lambda: not proc.alive, 60, "the relay to stop")
    log = proc.log()
    assert proc.returncode == 3, log
    assert "waiting up to" in log and "NATS at nats://127.0.0.1" in log and "RELAY_NATS_SERVERS" in log
    errors = [line for line in log.splitlines() if '"level": "ERROR"' in line]
    assert len(errors) == 1 and "cannot reach NATS" in errors[0] and "Traceback" not in log

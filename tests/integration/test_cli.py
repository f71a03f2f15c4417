"""The command line as an operator meets it: exit codes and messages, real processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from relay.devstack import free_port
from tests.support import ROOT, RelayThread, settings_env, topic_size, wait_until
from relay.outbox import Outbox, OutboxEvent


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


def test_invalid_configuration_exits_2_naming_the_setting(env):
    environ = settings_env(env.settings) | {"RELAY_BATCH_MAX_EVENTS": "lots"}
    result = run_cli("run", env=environ)
    assert result.returncode == 2
    assert "RELAY_BATCH_MAX_EVENTS" in result.stderr and "Traceback" not in result.stderr
    flag = run_cli("run", "--lease-ttl-s", "-1", env=settings_env(env.settings))
    assert flag.returncode == 2 and "RELAY_LEASE_TTL_S" in flag.stderr


def test_unknown_kafka_property_exits_2_naming_it(env):
    environ = settings_env(env.settings) | {"RELAY_KAFKA_NOT_A_PROPERTY": "1"}
    result = run_cli("run", env=environ)
    assert result.returncode == 2, result.stderr
    assert "RELAY_KAFKA_NOT_A_PROPERTY" in result.stderr and "Traceback" not in result.stderr


def test_unreachable_mongodb_is_a_clear_error_not_a_traceback(env):
    environ = settings_env(env.settings) | {
        "RELAY_MONGODB_URI": f"mongodb://127.0.0.1:{free_port()}/?replicaSet=rs0",
        "RELAY_CONNECT_TIMEOUT_S": "2"}
    result = run_cli("run", env=environ)
    assert result.returncode == 3
    assert "cannot reach MongoDB" in result.stderr and "RELAY_MONGODB_URI" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["run"], ["tail", "any-topic"]], ids=["run", "tail"])
def test_unreachable_kafka_is_a_clear_error_not_a_traceback(env, command):
    environ = settings_env(env.settings) | {
        "RELAY_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}", "RELAY_CONNECT_TIMEOUT_S": "2"}
    result = run_cli(*command, env=environ)
    assert result.returncode == 3
    assert "cannot reach Kafka" in result.stderr and "RELAY_KAFKA_BOOTSTRAP_SERVERS" in result.stderr
    assert "Traceback" not in result.stderr and "|FAIL|" not in result.stderr, "no librdkafka log noise"


def test_status_reports_lease_and_checkpoint_lag(env):
    Outbox(env.outbox).add(OutboxEvent.new("order", "s1", "Created", {}))
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the event")
        result = run_cli("status", env=settings_env(env.settings))
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["outbox"] == env.settings.namespace
    assert status["lease"]["owner"] == env.settings.instance_id and status["lease"]["fencingToken"] == 1
    assert status["checkpoint"]["lagSeconds"] is not None and status["checkpoint"]["lagSeconds"] < 60


def test_outbox_init_creates_the_index(env):
    result = run_cli("outbox", "init", env=settings_env(env.settings))
    assert result.returncode == 0, result.stderr
    assert "occurredAt_1" in env.outbox.index_information()

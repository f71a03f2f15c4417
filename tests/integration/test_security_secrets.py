"""No secret in any output: canary values in every credential (the MongoDB URI's password, the
SASL password, the SSL key password, the Schema Registry's basic auth and URL user info), then
everything each command prints is searched for them, on its success and failure paths
(unreachable server, wrong password, refused setting), with DEBUG logs in JSON and text, and
the HTTP endpoints of a running relay.

Each command runs as a child process (`python -m relay ...`), so what is searched is exactly what
an operator's log collector would receive on stdout and stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from relay.dev.processes import free_port
from relay.mongo.privileges import required
from tests.security_servers import AuthMongo, auth_mongo
from tests.support import ROOT, Servers, wait_until, write_events

CANARY = "CanaryQz"  # each credential gets its own numbered canary: the search names which leaked
CANARIES = {n: f"{CANARY}{n}x7" for n in range(1, 6)}
SECRET_ENV = {
    "RELAY_KAFKA_SASL_PASSWORD": CANARIES[2],
    "RELAY_KAFKA_SSL_KEY_PASSWORD": CANARIES[3],
    "RELAY_SCHEMA_REGISTRY_BASIC_AUTH": f"reguser:{CANARIES[4]}",
}


@pytest.fixture(scope="module")
def mongo() -> Iterator[AuthMongo]:
    with auth_mongo() as server:
        yield server


def _relay(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    proc = subprocess.run([sys.executable, "-m", "relay", *args], env=base | SECRET_ENV | env | {"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr


def _assert_clean(what: str, output: str) -> None:
    leaked = [n for n, value in CANARIES.items() if value in output]
    assert not leaked, f"{what} printed canaries {leaked}:\n{output}"


def _env(uri: str, servers: Servers | None = None, **more: str) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {
        "RELAY_MONGODB_URI": uri, "RELAY_KAFKA_BOOTSTRAP_SERVERS": servers.kafka_bootstrap if servers else
        f"127.0.0.1:{free_port()}", "RELAY_DATABASE": f"c_{tag}", "RELAY_TOPIC_TEMPLATE": f"c{tag}.{{aggregateType}}",
        "RELAY_CONNECT_TIMEOUT_S": "1", "RELAY_HTTP_PORT": "0", "RELAY_LOG_LEVEL": "DEBUG", "RELAY_LOG_FORMAT": "json",
        "RELAY_LEASE_TTL_S": "4", "RELAY_HEARTBEAT_INTERVAL_S": "1", "RELAY_STANDBY_POLL_S": "0.3", **more,
    }


COMMANDS = [["run"], ["status"], ["outbox", "init"], ["outbox", "prune", "--dry-run"], ["checkpoint", "reset"],
            ["security", "role", "--create"], ["tail", "some.topic", "--max-messages", "1"]]


def test_failure_paths_print_no_credential(mongo: AuthMongo) -> None:
    closed = free_port()
    unreachable = _env(f"mongodb://relayuser:{CANARIES[1]}@127.0.0.1:{closed}/?replicaSet=rs0&authSource=admin")
    wrong = _env(mongo.uri("relayuser", CANARIES[1]))
    for args, fmt in [(args, "json") for args in COMMANDS] + [(["run"], "text")]:
        code, out = _relay(args, unreachable | {"RELAY_LOG_FORMAT": fmt})
        assert code in (2, 3), f"unreachable {args}: exit {code}\n{out}"
        _assert_clean(f"unreachable {args} ({fmt})", out)
    for args in COMMANDS[:-1]:  # tail reads Kafka only
        code, out = _relay(args, wrong)
        assert code == 2 and "refused the credentials" in out, f"wrong password {args}: exit {code}\n{out}"
        assert "relayuser:***@" in out
        _assert_clean(f"wrong password {args}", out)
    refused = [
        {"RELAY_KAFKA_SASL_MECHANISM": "NOPE"}, {"RELAY_BATCH_MAX_EVENTS": f"x{CANARIES[5]}"},
        {"RELAY_MONGODB_URI": f"http://relayuser:{CANARIES[1]}@127.0.0.1:1/"},
        {"RELAY_KAFKA_SSL_KEY_PASSWORD": f"{CANARIES[3]}", "RELAY_KAFKA_SSL_KEY_LOCATION": "/nonexistent/key.pem",
         "RELAY_KAFKA_SECURITY_PROTOCOL": "SSL"},
    ]
    for change in refused:
        code, out = _relay(["run"], wrong | change)
        assert code == 2, f"refused {change}: exit {code}\n{out}"
        leaked = [n for n, v in CANARIES.items() if v in out and n != 5]  # 5 is not a credential, only a marker
        assert not leaked, f"refused {change} printed {leaked}:\n{out}"


def _get(port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as exc:  # 503 while not ready: the body still counts
        return str(exc.read().decode())


def test_success_paths_and_endpoints_print_no_credential(mongo: AuthMongo, servers: Servers) -> None:
    env = _env("", servers)
    db_name = env["RELAY_DATABASE"]
    role = required(db_name, "outbox", "outbox_relay_leases", cleanup=False, partitions=1)
    env["RELAY_MONGODB_URI"] = mongo.user_with("relaycanary", CANARIES[1], role)
    with mongo.admin() as admin:
        admin[db_name].create_collection("outbox")
        write_events(admin[db_name], "outbox", 20, writers=1)
    port = free_port()
    outputs: dict[str, Any] = {}
    log = ROOT / f".relay-canary-{db_name}.log"
    try:
        with open(log, "w") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "relay", "run"], stdout=sink, stderr=subprocess.STDOUT,
                                    cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
                                    | SECRET_ENV | env | {"RELAY_HTTP_PORT": str(port), "RELAY_HTTP_HOST": "127.0.0.1",
                                                         "PYTHONPATH": str(ROOT)})
        wait_until(lambda: '"role": "leader"' in _get_safe(port, "/readyz"), 60, "the relay leads")
        time.sleep(1.5)  # a heartbeat or two at DEBUG
        outputs |= {path: _get(port, path) for path in ("/metrics", "/livez", "/readyz")}
        code, out = _relay(["tail", env["RELAY_TOPIC_TEMPLATE"].format(aggregateType="order"), "--from-beginning",
                            "--max-messages", "3"], env)
        assert code == 0, out
        outputs["tail"] = out
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        outputs["run"] = log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.unlink(missing_ok=True)
    assert "relay watching" in outputs["run"] and "relay_" in outputs["/metrics"]
    for args in (["status"], ["security", "role"], ["outbox", "prune", "--dry-run"]):
        code, out = _relay(args, env | {"RELAY_LOG_FORMAT": "text"})
        assert code in (0, 4), f"{args}: exit {code}\n{out}"
        outputs[" ".join(args)] = out
    for what, out in outputs.items():
        _assert_clean(what, out)


def _get_safe(port: int, path: str) -> str:
    try:
        return _get(port, path)
    except OSError:
        return ""

"""No secret in any output: a numbered canary value in every credential, then everything each
command prints is searched for them, on its success and failure paths (unreachable server, wrong
password, refused setting), with DEBUG logs in JSON and text, and the HTTP endpoints of a running
relay.

The credentials (CANARIES): the MongoDB URI's password (1) and its
`tlsCertificateKeyFilePassword` (9); RELAY_KAFKA_SASL_PASSWORD (2), RELAY_KAFKA_SSL_KEY_PASSWORD (3),
RELAY_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET (7), RELAY_KAFKA_SSL_KEYSTORE_PASSWORD (8) (librdkafka
takes them; a PLAINTEXT broker never asks for them); the Schema Registry's
RELAY_SCHEMA_REGISTRY_BASIC_AUTH (4) and the user info of RELAY_SCHEMA_REGISTRY_URL (6), each
actually used by a running relay against an unreachable registry; and the pipeline's
`--kafka-option sasl.jaas.config` (10) and `--spark-conf` secret (11). Canary 5 marks a refused
non-credential value.

Each command runs as a child process (`python -m relay ...`), so what is searched is exactly what
an operator's log collector would receive on stdout and stderr. The pipeline's failure paths run
here (they stop before Spark starts); its success path needs a Spark JVM (whose py4j bridge logs
every command it sends at DEBUG, Kafka options included), so it runs with the Spark tests, in
their session: tests/spark/test_pipeline_canary.py.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from relay.core.namespace import Namespace
from relay.dev.processes import free_port, spawn
from relay.mongo.privileges import required
from tests.security_servers import AuthMongo, auth_mongo
from tests.support.paths import ROOT
from tests.support.servers import Servers
from tests.support.waiting import wait_until
from tests.support.writes import write_events

CANARY = "CanaryQz"  # each credential gets its own numbered canary: the search names which leaked
CANARIES = {n: f"{CANARY}{n}x7" for n in range(1, 12)}
SECRET_ENV = {
    "RELAY_KAFKA_SASL_PASSWORD": CANARIES[2],
    "RELAY_KAFKA_SSL_KEY_PASSWORD": CANARIES[3],
    "RELAY_SCHEMA_REGISTRY_BASIC_AUTH": f"reguser:{CANARIES[4]}",
    "RELAY_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": CANARIES[7],
    "RELAY_KAFKA_SSL_KEYSTORE_PASSWORD": CANARIES[8],
}
URI_OPTIONS = f"&tlsCertificateKeyFilePassword={CANARIES[9]}"  # no client key here: pymongo holds it unused
JAAS = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="relay" password="{CANARIES[10]}";'


@pytest.fixture(scope="module")
def mongo() -> Iterator[AuthMongo]:
    with auth_mongo(tls=True) as server:  # TLS: pymongo uses tlsCertificateKeyFilePassword only then
        yield server


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")} | {"PYTHONPATH": str(ROOT)}


def _relay(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "relay", *args], env=_base_env() | SECRET_ENV | env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr


def assert_clean(what: str, output: str, but: tuple[int, ...] = ()) -> None:
    leaked = [n for n, value in CANARIES.items() if value in output and n not in but]
    assert not leaked, f"{what} printed canaries {leaked}:\n{output[-20000:]}"


def _env(uri: str, servers: Servers | None = None, **more: str) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {
        "RELAY_MONGODB_URI": uri, "RELAY_KAFKA_BOOTSTRAP_SERVERS": servers.kafka_bootstrap if servers else
        f"127.0.0.1:{free_port()}", "RELAY_DATABASE": f"c_{tag}", "RELAY_TOPIC_TEMPLATE": f"c{tag}.{{aggregateType}}",
        "RELAY_CONNECT_TIMEOUT_S": "1", "RELAY_HTTP_PORT": "0", "RELAY_LOG_LEVEL": "DEBUG", "RELAY_LOG_FORMAT": "json",
        "RELAY_LEASE_TTL_S": "4", "RELAY_HEARTBEAT_INTERVAL_S": "1", "RELAY_STANDBY_POLL_S": "0.3",
        "RELAY_RESTART_BACKOFF_MAX_S": "1", **more,
    }


COMMANDS = [["run"], ["status"], ["outbox", "init"], ["outbox", "prune", "--dry-run"], ["checkpoint", "reset"],
            ["security", "role", "--create"], ["pipeline", "audit"], ["demo", "--events", "1"],
            ["tail", "some.topic", "--max-messages", "1"]]


def test_failure_paths_print_no_credential(mongo: AuthMongo) -> None:
    user_info = {"RELAY_SCHEMA_REGISTRY_URL": f"http://reguser:{CANARIES[6]}@127.0.0.1:{free_port()}",
                 "RELAY_SCHEMA_REGISTRY_BASIC_AUTH": ""}
    uri = f"mongodb://relayuser:{CANARIES[1]}@127.0.0.1:{free_port()}/?replicaSet=rs0&authSource=admin{URI_OPTIONS}"
    unreachable = _env(uri, RELAY_SCHEMA_REGISTRY_URL=f"http://127.0.0.1:{free_port()}")  # and basic auth
    wrong = _env(mongo.uri("relayuser", CANARIES[1]) + URI_OPTIONS)
    refused = [
        {"RELAY_KAFKA_SASL_MECHANISM": "NOPE"}, {"RELAY_BATCH_MAX_EVENTS": f"x{CANARIES[5]}"},
        {"RELAY_MONGODB_URI": f"http://relayuser:{CANARIES[1]}@127.0.0.1:1/"},
        {"RELAY_MONGODB_URI": f"mongodb://relayuser:{CANARIES[1]}@unescaped@127.0.0.1:1/"},
        {"RELAY_SCHEMA_REGISTRY_URL": f"ftp://reguser:{CANARIES[6]}@127.0.0.1:1/"},
        {"RELAY_SCHEMA_REGISTRY_URL": f"http://reguser:{CANARIES[6]}@127.0.0.1:1/"},  # and basic auth: both
        {"RELAY_KAFKA_SSL_KEY_PASSWORD": f"{CANARIES[3]}", "RELAY_KAFKA_SSL_KEY_LOCATION": "/nonexistent/key.pem",
         "RELAY_KAFKA_SECURITY_PROTOCOL": "SSL"},
    ]
    # (what, arguments, environment, exit codes expected, text the output must hold)
    runs = [(f"unreachable {a}", a, unreachable, (2, 3), "") for a in COMMANDS]
    runs += [("unreachable run (text)", ["run"], unreachable | {"RELAY_LOG_FORMAT": "text"}, (3,), "***@"),
             ("registry user info", ["run"], unreachable | user_info, (3,), ""),
             ("registry user info", ["pipeline", "audit"], unreachable | user_info, (3,), "relayuser:***@")]
    runs += [(f"wrong password {a}", a, wrong, (2,), "relayuser:***@") for a in COMMANDS[:-1]]  # tail: Kafka only
    runs += [(f"refused {change}", ["run"], wrong | change, (2,), "") for change in refused]
    runs += [("a malformed --kafka-property", ["run", "--kafka-property", f"sasl.password {CANARIES[2]}"], wrong, (2,),
              "item 1 of --kafka-property")]
    runs += [(" ".join(a), a, unreachable, (0,), "") for a in (["schemas", "check", "--baseline", "schemas"],
                                                              ["dev", "status"])]  # they print no setting
    with ThreadPoolExecutor(3) as pool:  # each child mostly waits: a 1 s connect timeout
        results = list(pool.map(lambda run: _relay(run[1], run[2]), runs))
    for (what, *_, codes, shown), (code, out) in zip(runs, results, strict=True):
        assert code in codes and shown in out, f"{what}: exit {code}\n{out}"
        assert_clean(what, out, but=(5,))  # 5 is not a credential, only a marker
        assert "refused the credentials" in out or not what.startswith("wrong password"), out


def _get(port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as exc:  # 503 while not ready: the body still counts
        return str(exc.read().decode())


def _get_safe(port: int, path: str) -> str:
    try:
        return _get(port, path)
    except OSError:
        return ""


def _running(env: dict[str, str], log: Path, until: Any, what: str, endpoints: tuple[str, ...] = ()) -> dict[str, str]:
    """Run the relay with `env` until `until(port, log text)` holds, read `endpoints`, stop it with
    SIGTERM; what it printed (and the endpoints' answers)."""
    port = free_port()
    with open(log, "w") as sink:
        proc = spawn([sys.executable, "-m", "relay", "run"], stdout=sink, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=_base_env() | SECRET_ENV | env
                                | {"RELAY_HTTP_PORT": str(port), "RELAY_HTTP_HOST": "127.0.0.1"})
    try:
        wait_until(lambda: until(port, log.read_text()), 60, what)
        time.sleep(1.5)  # a heartbeat or two at DEBUG
        outputs = {path: _get(port, path) for path in endpoints}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        outputs[what] = log.read_text()
        return outputs
    finally:
        if proc.poll() is None:
            proc.kill()
        log.unlink(missing_ok=True)


def _operator(mongo: AuthMongo) -> str:
    """An operator's URI holding canaries 1 and 9 (root: `outbox init`, `checkpoint reset --force`,
    `security role --create` on their success paths)."""
    with mongo.admin() as admin:
        if admin.admin.command({"usersInfo": "opcanary"})["users"]:
            admin.admin.command({"dropUser": "opcanary"})
        admin.admin.command({"createUser": "opcanary", "pwd": CANARIES[1], "roles": [{"role": "root", "db": "admin"}]})
    return mongo.uri("opcanary", CANARIES[1]) + URI_OPTIONS


def test_success_paths_and_endpoints_print_no_credential(mongo: AuthMongo, servers: Servers) -> None:
    env = _env("", servers)
    db_name, outputs = env["RELAY_DATABASE"], {}
    operator = env | {"RELAY_MONGODB_URI": _operator(mongo)}
    for args in (["outbox", "init"], ["security", "role", "--create", "--role-name", f"canary{db_name}"]):
        code, out = _relay(args, operator)
        assert code == 0, f"{args}: exit {code}\n{out}"
        outputs[" ".join(args)] = out
    role = required(db_name, [Namespace(db_name, "outbox")], "outbox_relay_leases", cleanup=False)
    env["RELAY_MONGODB_URI"] = mongo.user_with("relaycanary", CANARIES[1], role) + URI_OPTIONS
    with mongo.admin() as admin:
        write_events(admin[db_name], "outbox", 20, writers=1)
    outputs |= _running(env, ROOT / f".relay-canary-{db_name}.log",
                        lambda port, _text: '"role": "leader"' in _get_safe(port, "/readyz"), "run",
                        ("/metrics", "/livez", "/readyz"))
    assert "relay watching" in outputs["run"] and "relay_" in outputs["/metrics"]
    topic = env["RELAY_TOPIC_TEMPLATE"].format(aggregateType="order")
    for args in (["tail", topic, "--from-beginning", "--max-messages", "3"], ["status"], ["security", "role"],
                 ["outbox", "prune", "--dry-run"]):
        code, out = _relay(args, env | {"RELAY_LOG_FORMAT": "text"})
        assert code in (0, 4), f"{args}: exit {code}\n{out}"
        outputs[" ".join(args)] = out
    code, outputs["checkpoint reset"] = _relay(["checkpoint", "reset", "--force"], operator)
    assert code == 0, outputs["checkpoint reset"]
    _registry_in_use(env, outputs)
    for what, out in outputs.items():
        assert_clean(what, out)


def _registry_in_use(env: dict[str, str], outputs: dict[str, str]) -> None:
    """The relay republishes (the checkpoint was reset) through an unreachable Schema Registry:
    once with the URL's user info, once with basic auth, in text at DEBUG; each restart line names
    the registry without its credentials."""
    closed = free_port()
    cases = {"registry user info": {"RELAY_SCHEMA_REGISTRY_URL": f"http://reguser:{CANARIES[6]}@127.0.0.1:{closed}",
                                    "RELAY_SCHEMA_REGISTRY_BASIC_AUTH": ""},
             "registry basic auth": {"RELAY_SCHEMA_REGISTRY_URL": f"http://127.0.0.1:{closed}"}}
    for what, registry in cases.items():
        text = env | registry | {"RELAY_LOG_FORMAT": "text"}
        log = ROOT / f".relay-canary-{env['RELAY_DATABASE']}-{len(outputs)}.log"
        out = _running(text, log, lambda _port, printed: "cannot reach the Schema Registry" in printed, what)[what]
        assert f"127.0.0.1:{closed}" in out, out
        outputs[what] = out

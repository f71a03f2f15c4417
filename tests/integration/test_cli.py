"""The command line as an operator meets it: exit codes and messages, real processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from relay.dev.processes import spawn
from relay.dev.stack import free_port
from relay.outbox import Outbox, OutboxEvent
from tests.support.leases import lease_doc
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import topic_size
from tests.support.waiting import wait_until


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


@pytest.mark.parametrize(("command", "setting", "server"), [
    (["status"], "RELAY_MONGODB_URI", "MongoDB"),
    (["tail", "any-topic"], "RELAY_KAFKA_BOOTSTRAP_SERVERS", "Kafka"),
], ids=["mongodb", "kafka"])
def test_a_server_that_does_not_answer_is_named_at_once_not_after_the_timeout(tmp_path, command, setting, server):
    """Nothing listens on the port: one line names what the command waits for and how long, while
    it still waits (the connect timeout is far from over), instead of the timeout's silence."""
    port = free_port()
    value = f"mongodb://127.0.0.1:{port}/?replicaSet=rs0" if server == "MongoDB" else f"127.0.0.1:{port}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")} | {
        setting: value, "RELAY_CONNECT_TIMEOUT_S": "300", "RELAY_LOG_FORMAT": "text", "PYTHONPATH": str(ROOT)}
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        proc = spawn([sys.executable, "-m", "relay", *command], env=environ, cwd=ROOT, stdout=subprocess.DEVNULL,
                     stderr=err)

    def alive() -> None:
        assert proc.poll() is None, f"it ended: {log.read_text()}"

    try:
        line = wait_until(lambda: next((x for x in log.read_text().splitlines() if "waiting" in x), None), 120,
                          "the waiting line", alive=alive)
        alive()  # the line comes while it waits, not at the timeout
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert "WARNING relay waiting up to " in line and f"s more for {server} at {value} ({setting}, " in line, line
    assert "RELAY_CONNECT_TIMEOUT_S=300): no answer yet" in line, line


def test_status_reports_lease_and_checkpoint_lag(env):
    Outbox(env.outbox).add(OutboxEvent.new("order", "s1", "Created", {}))
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the event")
        wait_until(lambda: lease_doc(env.db, env.settings).get("tokenClusterTime"), 60, "a checkpoint")
        stored = lease_doc(env.db, env.settings)["tokenClusterTime"].time
        result = run_cli("status", env=settings_env(env.settings))
        finished = time.time()
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["outbox"] == str(env.namespace)
    assert status["lease"]["owner"] == env.settings.instance_id and status["lease"]["fencingToken"] == 1
    assert status["lease"]["acquiredAt"] is not None, "an outbox without partitions shows when its lease was taken"
    assert [row["lease"]["acquiredAt"] for row in status["leases"]] == [status["lease"]["acquiredAt"]]
    # "now minus the checkpoint's cluster time": at most the time since the checkpoint read before
    # the command (the one it read can only be newer)
    assert status["checkpoint"]["lagSeconds"] is not None and 0 <= status["checkpoint"]["lagSeconds"] <= finished - stored
    # One time format throughout (RFC 3339, UTC, ms), and the token's ellipsis as it is, not \u2026.
    times = [status["lease"]["expiresAt"], status["lease"]["acquiredAt"], status["checkpoint"]["clusterTime"],
             status["checkpoint"]["storedAt"], *[r["joinedAt"] for r in status["replicas"]]]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", t) for t in times), times
    assert status["checkpoint"]["token"].endswith("…") and "\\u" not in result.stdout, result.stdout


def test_a_misspelled_setting_exits_2_naming_the_one_meant_in_one_line(env):
    environ = settings_env(env.settings) | {"RELAY_OUTBOXS": f"{env.settings.database}.outbox"}
    result = run_cli("run", env=environ)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "outbox-relay: ConfigError: RELAY_OUTBOXS: unknown setting; did you mean RELAY_OUTBOXES?"]


def test_a_command_meeting_an_unexpected_server_error_exits_5_naming_it(env):
    from tests.support.mongodb import failpoint

    with failpoint(env.client, "alwaysOn", failCommands=["find", "aggregate"], errorCode=2):
        result = run_cli("status", env=settings_env(env.settings))
    assert result.returncode == 5, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("outbox-relay: ServerRefusedError: ") and " on t_" in line and ": BadValue (2): " in line, line
    assert "Traceback" not in result.stderr and "RawBSONDocument" not in result.stderr


def test_outbox_init_creates_the_index(env):
    result = run_cli("outbox", "init", env=settings_env(env.settings))
    assert result.returncode == 0, result.stderr
    assert "occurredAt_1" in env.outbox.index_information()


def test_unreachable_mongodb_message_gives_the_whole_cause_in_one_line(env):
    port = free_port()
    environ = settings_env(env.settings) | {
        "RELAY_MONGODB_URI": f"mongodb://127.0.0.1:{port}/?replicaSet=rs0", "RELAY_CONNECT_TIMEOUT_S": "2"}
    result = run_cli("run", env=environ)
    [line] = [line for line in result.stderr.splitlines() if "cannot reach MongoDB" in line]
    assert f"127.0.0.1:{port}: [Errno 111] Connection refused" in line, line
    assert "Topology Description" not in line and "configured timeouts" not in line
    assert line.count("(") == line.count(")"), f"a cut message: {line}"


def test_a_mongodb_that_is_not_a_replica_set_is_a_configuration_error(env, tmp_path):
    from relay.dev.stack import ManagedProcess, default_mongod

    port = free_port()
    (tmp_path / "db").mkdir()
    mongod = default_mongod()
    standalone = ManagedProcess("standalone", [str(mongod.path), "--port", str(port), "--dbpath",
                                               str(tmp_path / "db"), "--bind_ip", "127.0.0.1"],
                                tmp_path / "mongod.log", env=mongod.environ())
    standalone.start()
    try:
        import pymongo

        wait_until(lambda: _pings(pymongo, port), 60, "the standalone mongod")
        environ = settings_env(env.settings) | {"RELAY_MONGODB_URI": f"mongodb://127.0.0.1:{port}/",
                                                "RELAY_CONNECT_TIMEOUT_S": "5"}
        result = run_cli("run", env=environ)
    finally:
        standalone.stop()
    assert result.returncode == 2, result.stderr
    assert "RELAY_MONGODB_URI" in result.stderr and "not a replica set member" in result.stderr


def _pings(pymongo, port: int) -> bool:
    try:
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=500) as c:
            return bool(c.admin.command("ping"))
    except pymongo.errors.PyMongoError:
        return False


def test_checkpoint_reset_is_refused_while_a_leader_holds_the_lease_unless_forced(env):
    outbox = Outbox(env.outbox)
    outbox.add(OutboxEvent.new("order", "r1", "Created", {}))
    environ = settings_env(env.settings.replace(instance_id="operator"))
    with RelayThread(env.settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the event")
        refused = run_cli("checkpoint", "reset", env=environ)
        assert refused.returncode == 2, refused.stderr
        assert env.settings.instance_id in refused.stderr and "--force" in refused.stderr
        assert env.db[env.settings.lease_collection].find_one()["resumeToken"] is not None, "nothing reset"
        forced = run_cli("checkpoint", "reset", "--force", env=environ)
        assert forced.returncode == 0, forced.stderr
        assert "fenced out" in forced.stdout
        # The old holder's next write fails; it takes the lease again with a new fencing token and
        # starts where RELAY_START_AT says (oplog-start: the event is published again).
        wait_until(lambda: relay.metric("relay_fencing_token") >= 3, 60, "the relay to lead again")
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 2, 60, "the replay")
    assert relay.error is None, relay.error
    lease = env.db[env.settings.lease_collection].find_one()
    assert lease["owner"] is None and lease["fencingToken"] >= 3


def test_an_upgraded_relay_resumes_from_the_lease_and_checkpoint_an_earlier_version_stored(env):
    """The unpartitioned lease document as the relay has always written it (before a single relay
    became a group of one): `_id` the namespace, the checkpoint of the 100th event, held by a
    replica that is gone, beside its old-style `_replicas` entry. The upgraded relay takes the
    lease over (fencing token + 1), publishes only what follows the checkpoint, and `status`
    still shows the lease and checkpoint at the top."""
    import datetime as dt

    from bson import Timestamp

    from relay.mongo.pipeline import pipeline_fingerprint
    from tests.support.oracle import assert_complete_and_ordered
    from tests.support.topics import read_topic
    from tests.support.writes import write_events

    before = write_events(env.db, env.settings.outbox_collection, total=100, writers=1)
    with env.outbox.watch(start_at_operation_time=Timestamp(1, 1)) as stream:
        changes = [stream.next() for _ in range(100)]
    token, ns = changes[-1]["_id"], str(env.namespace)
    now = dt.datetime.now(dt.UTC)
    leases = env.db[env.settings.lease_collection]
    leases.insert_one({
        "_id": ns, "owner": "old-relay", "fencingToken": 7, "expiresAt": now - dt.timedelta(minutes=1),
        "renewedAt": now - dt.timedelta(minutes=2), "resumeToken": token,
        "tokenClusterTime": changes[-1]["clusterTime"], "pipelineFingerprint": pipeline_fingerprint(env.namespace),
        "delivery": "at-least-once", "checkpointAt": now - dt.timedelta(minutes=2),
    })
    env.db[f"{env.settings.lease_collection}_replicas"].insert_one(
        {"_id": f"{ns}/old-relay", "outbox": ns, "instance": "old-relay", "role": "leader", "seenAt": now})
    after = write_events(env.db, env.settings.outbox_collection, total=50, writers=1, seed=9)
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 50, 60, "the 50 new events")
        wait_until(lambda: lease_doc(env.db, env.settings)["resumeToken"] != token, 30, "a newer checkpoint")
        shown = json.loads(run_cli("status", env=settings_env(env.settings)).stdout)
    records = read_topic(env.servers.kafka_bootstrap, env.topic())
    assert not {r.id for r in records} & before.ids, "nothing the stored checkpoint covers is published again"
    assert_complete_and_ordered(records, after)
    assert lease_doc(env.db, env.settings)["fencingToken"] == 8, "the takeover fences the old holder"
    assert shown["lease"]["fencingToken"] == 8 and shown["checkpoint"]["token"]
    assert [r["instance"] for r in shown["replicas"]] == [env.settings.instance_id]

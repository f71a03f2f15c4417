"""`outbox-relay dev up|status|down`: a detached stack that can be stopped, crash, and come back
on the same ports; `--format env` for `eval`; no Java: one line, exit 2, nothing fetched or
started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pymongo
from confluent_kafka.admin import AdminClient

from relay.dev.mongodb import DEFAULT_VERSION
from relay.dev.stack import KAFKA_VERSION, cache_dir, pid_alive
from tests.support.paths import ROOT


def _environ(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return env | {"RELAY_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}


def _dev(cache: Path, action: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "relay", "dev", action], env=_environ(cache), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if action == "up":
        assert "export RELAY_MONGODB_URI='" in proc.stdout
    return json.JSONDecoder().raw_decode(proc.stdout)[0]


def _eval_up(cache: Path) -> dict[str, str]:
    """`eval "$(outbox-relay dev up --format env)"` in bash; the variables it set."""
    script = (f'eval "$({sys.executable} -m relay dev up --format env)" && '
              'printf "%s\n" "$RELAY_MONGODB_URI" "$RELAY_KAFKA_BOOTSTRAP_SERVERS"')
    proc = subprocess.run(["bash", "-c", script], env=_environ(cache), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    uri, bootstrap = proc.stdout.splitlines()
    return {"uri": uri, "bootstrap": bootstrap}


def _pids(state: dict[str, Any]) -> list[int]:
    return [*state["mongodb"]["pids"], state["kafka"]["pid"]]


def _works(state: dict[str, Any]) -> None:
    with pymongo.MongoClient(state["mongodb"]["uri"], serverSelectionTimeoutMS=30000) as client:
        client.dev_check.things.insert_one({"ok": True})
        assert client.dev_check.things.count_documents({}) >= 1
    with AdminClient({"bootstrap.servers": state["kafka"]["bootstrap_servers"]}) as admin:
        assert admin.list_topics(timeout=30).brokers


def test_dev_stack_comes_back_after_down_and_after_a_crash(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # The Kafka jars and the mongod `make setup` fetched, instead of fetching them again.
    for name in (f"kafka-{KAFKA_VERSION}", f"mongodb-{DEFAULT_VERSION}"):
        (cache / name).symlink_to(cache_dir() / name)
    started: list[int] = []
    try:
        first = _dev(cache, "up")
        started += _pids(first)
        _works(first)
        assert _dev(cache, "status")["running"] is True
        assert _dev(cache, "up")["mongodb"]["uri"] == first["mongodb"]["uri"], "up again reports the running one"

        down = _dev(cache, "down")
        assert sorted(down["stopped"]) == ["kafka", "mongod0"]
        assert not any(pid_alive(pid) for pid in _pids(first))
        assert [p.name for p in (cache / "devstack").iterdir()] == ["ports.json"], "down deletes the data"

        exported = _eval_up(cache)  # `eval` of --format env: only export lines on stdout
        second = _dev(cache, "status")
        started += _pids(second)
        assert exported == {"uri": second["mongodb"]["uri"], "bootstrap": second["kafka"]["bootstrap_servers"]}
        assert exported == {"uri": first["mongodb"]["uri"], "bootstrap": first["kafka"]["bootstrap_servers"]}, \
            "the same ports after down and up"
        assert second["kafka"]["controller_port"] == first["kafka"]["controller_port"]
        _works(second)
        for pid in _pids(second):  # a crash: both servers SIGKILLed, the state file left behind
            os.kill(pid, signal.SIGKILL)
        assert _dev(cache, "status")["running"] is False

        third = _dev(cache, "up")  # the crashed set's data is discarded: its config named these ports too
        started += _pids(third)
        _works(third)
        assert third["mongodb"]["uri"] == first["mongodb"]["uri"], "the crashed stack's ports, free again"
        assert _dev(cache, "down")["stopped"]
    finally:
        if (cache / "devstack.json").exists():
            _dev(cache, "down")
        for pid in started:  # only what this test started, by pid, if `down` could not stop it
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_dev_fetch_needs_no_maven_and_the_broker_starts_from_what_it_fetched(tmp_path):
    """`outbox-relay dev fetch` with no `mvn` on PATH (a PATH holding only `java`), into a fresh
    cache: the Kafka jars come from Maven Central as files with pinned SHA-256
    (relay.dev.kafka_jars); then `dev up` starts the broker from them. The cache's mongod is the
    one `make setup` fetched (linked in: its own fetch has its own tests)."""
    import shutil

    from relay.dev.kafka_jars import KAFKA_JARS

    java = shutil.which("java")
    assert java is not None, "Java runs the broker"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(Path(java).resolve())
    assert shutil.which("mvn", path=str(bin_dir)) is None
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"mongodb-{DEFAULT_VERSION}").symlink_to(cache_dir() / f"mongodb-{DEFAULT_VERSION}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JAVA_HOME"))}
    env |= {"RELAY_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), "PATH": str(bin_dir)}

    def dev(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "relay", "dev", action], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=600)

    fetched = dev("fetch")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    libs = cache / f"kafka-{KAFKA_VERSION}" / "libs"
    assert f"Kafka {KAFKA_VERSION} jars in {libs}" in fetched.stdout
    assert sorted(p.name for p in libs.glob("*.jar")) == sorted(j.filename for j in KAFKA_JARS)
    up = dev("up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        _works(json.JSONDecoder().raw_decode(up.stdout)[0])
    finally:
        down = dev("down")
    assert down.returncode == 0, down.stdout + down.stderr


def test_dev_up_without_java_exits_2_in_one_line_before_fetching_or_starting_anything(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    no_java = tmp_path / "bin"
    no_java.mkdir()
    env = {k: v for k, v in _environ(cache).items() if k != "JAVA_HOME"} | {"PATH": str(no_java)}
    proc = subprocess.run([sys.executable, "-m", "relay", "dev", "up"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ("outbox-relay: JavaMissingError: Java 17 or newer is needed to run the Kafka broker: "
                           "no `java` on PATH (install a JDK, or set JAVA_HOME)\n")
    assert list(cache.iterdir()) == [], "nothing fetched, no stack folder, no state"


def test_dev_status_as_env_lines_without_a_running_stack_prints_nothing_to_eval_and_exits_3(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "relay", "dev", "status", "--format", "env"], env=_environ(tmp_path),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (3, "")
    assert proc.stderr == "outbox-relay dev status: no dev stack is running (outbox-relay dev up)\n"

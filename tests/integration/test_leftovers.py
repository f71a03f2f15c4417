"""Servers die with their test (docs/testing.md): a `make test` whose controller is killed, however,
leaves no mongod, Kafka broker, relay or worker behind. The workers end with their controller
(PR_SET_PDEATHSIG, tests/conftest.py) and each worker's reaper (relay.dev.reaper) kills what the
worker started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from relay.dev.processes import pid_alive, spawn
from tests.support.paths import ROOT
from tests.support.waiting import wait_until


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killing_the_suites_controller_leaves_no_server_relay_or_worker_running(tmp_path, sig):
    pid_file = tmp_path / "pids.json"
    env = {**os.environ, "RELAY_TEST_LEFTOVERS": str(pid_file)}
    for name in ("RELAY_TEST_MONGODB_URI", "RELAY_TEST_KAFKA_BOOTSTRAP", "RELAY_TEST_DOCKER", "PYTEST_XDIST_WORKER"):
        env.pop(name, None)  # the inner run starts servers of its own
    argv = [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-q",
            "tests/support/leftovers_case.py", f"--basetemp={tmp_path / 'inner'}"]
    with open(tmp_path / "inner.log", "wb") as log:
        controller = spawn(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), 180, "the inner test's servers",
                   interval=0.5)
        pids: dict[str, int] = json.loads(pid_file.read_text())
        assert all(pid_alive(pid) for pid in pids.values()), pids
        os.kill(controller.pid, sig)
        wait_until(lambda: not [n for n, pid in pids.items() if pid_alive(pid)], 90,
                   "every process the inner run started to end", interval=0.5)
        controller.wait(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()

"""RELAY_TEST_DOCKER=1 exercised: server test modules run in a child pytest whose MongoDB and
Kafka are containers started by testcontainers (tests/docker_servers.py), from the stand-in
server images here (RELAY_TEST_MONGO_IMAGE, RELAY_TEST_KAFKA_IMAGE; the public images with Docker)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.containers import servers
from tests.support import ROOT

MODULES = ("tests/integration/test_change_source.py", "tests/integration/test_relay_end_to_end.py")


@pytest.mark.timeout(1800)
def test_server_modules_pass_against_servers_started_by_testcontainers(engine, docker_api):
    images = servers.ensure_servers(engine)
    env = engine.environ() | {"RELAY_TEST_DOCKER": "1", "DOCKER_HOST": docker_api,
                              "TESTCONTAINERS_RYUK_DISABLED": "true"}
    env |= {"RELAY_TEST_" + k: v for k, v in images.items()}
    for key in [k for k in env if k.startswith(("PYTEST_XDIST_", "RELAY_TEST_MONGODB", "RELAY_TEST_KAFKA_B"))]:
        del env[key]
    done = subprocess.run([sys.executable, "-m", "pytest", *MODULES, "-p", "no:cacheprovider", "-q"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    print("\n" + done.stdout.strip().splitlines()[-1])

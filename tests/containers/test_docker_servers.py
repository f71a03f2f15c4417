"""RELAY_TEST_DOCKER=1 exercised: server test modules run in a child pytest whose MongoDB and
Kafka are containers started by testcontainers (tests/docker_servers.py), from the stand-in
server images here (RELAY_TEST_MONGO_IMAGE, RELAY_TEST_KAFKA_IMAGE; the public images with Docker)."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.containers import servers
from tests.support.paths import ROOT

MODULES = ("tests/integration/test_change_source.py", "tests/integration/test_relay_end_to_end.py")
# The 10,000-event run of the second module adds 20 s and nothing the servers' containers change.
DESELECT = "not ten_thousand_events"


@pytest.mark.timeout(1800)
def test_server_modules_pass_against_servers_started_by_testcontainers(engine, docker_api, tmp_path):
    images = servers.ensure_servers(engine)
    env = engine.environ() | {"RELAY_TEST_DOCKER": "1", "DOCKER_HOST": docker_api,
                              "TESTCONTAINERS_RYUK_DISABLED": "true"}
    env |= {"RELAY_TEST_" + k: v for k, v in images.items()}
    for key in [k for k in env if k.startswith(("PYTEST_XDIST_", "RELAY_TEST_MONGODB", "RELAY_TEST_KAFKA_B"))]:
        del env[key]
    report = tmp_path / "report.xml"
    argv = [sys.executable, "-m", "pytest", *MODULES, "-k", DESELECT, "-p", "no:cacheprovider", "-q", "-n", "0",
            f"--junitxml={report}"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    output = done.stdout[-5000:] + done.stderr[-2000:]
    assert done.returncode == 0, output
    # Every collected test ran and passed: none skipped (a server fixture that skips would pass
    # with return code 0), none errored.
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] > 0 and counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, output)
    summary = done.stdout.strip().splitlines()[-1]
    passed = rf"^=* ?{counts['tests']} passed(, 1 deselected)?(, \d+ warnings?)? in "
    assert re.match(passed, summary), (summary, output)
    print(f"\n{summary}")

"""`outbox-relay demo` (issue 2's embedded default): N events end to end, and Ctrl-C stops
everything it started."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from relay.dev.processes import spawn
from relay.dev.stack import pid_alive
from tests.support.paths import ROOT
from tests.support.relays import settings_env
from tests.support.waiting import wait_until

EVENT_LINE = re.compile(r"^\S+\[\d+\]@\d+ (\S+) +(\S+) +id=(\S+) fencing=(\d+) payload=(\{.*\})$")


# `python -m relay` with Ctrl-C raising KeyboardInterrupt, as at a terminal. A shell starts a
# background job with SIGINT ignored, an ignored signal stays ignored across exec, and Python
# installs its KeyboardInterrupt handler only where SIGINT is at its default: a suite started
# from a background job would otherwise hand the demo a Ctrl-C it never receives.
_MAIN_WITH_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                     "sys.argv[0] = 'relay'; runpy.run_module('relay', run_name='__main__', alter_sys=True)")


def _demo(env_vars: dict[str, str], *args: str, stdout: Path, stderr: Path) -> subprocess.Popen[bytes]:
    with stdout.open("wb") as out, stderr.open("wb") as err:
        return spawn([sys.executable, "-c", _MAIN_WITH_CTRL_C, "demo", *args], env=env_vars, cwd=ROOT,
                                stdout=out, stderr=err)


def _event_lines(path: Path) -> list[re.Match[str]]:
    return [m for line in path.read_text().splitlines() if (m := EVENT_LINE.match(line))]


def _descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc (children, their children, ...)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_demo_on_given_servers_stops_after_n_events_with_every_one_delivered(env, tmp_path):
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    demo = _demo(settings_env(env.settings), "--events", "40", "--rate", "400", stdout=out, stderr=err)
    try:
        assert demo.wait(timeout=180) == 0, err.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert json.loads(out.read_text().splitlines()[-1]) == {"written": 40, "delivered": 40}
    events = _event_lines(out)
    assert len({m[3] for m in events}) == 40, out.read_text()
    stored = {str(d["_id"]): d for d in env.outbox.find()}
    for m in events:
        doc = stored[m[3]]
        assert (m[1], m[2], json.loads(m[5])) == (doc["aggregateId"], doc["eventType"], doc["payload"])


def test_demo_starts_its_own_stack_and_ctrl_c_stops_everything_it_started(tmp_path):
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")} | {"PYTHONPATH": str(ROOT)}
    if "RELAY_CACHE_DIR" in os.environ:  # the cached Kafka jars, if the suite uses another cache
        env_vars["RELAY_CACHE_DIR"] = os.environ["RELAY_CACHE_DIR"]
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    demo = _demo(env_vars, "--rate", "50", stdout=out, stderr=err)
    started: set[int] = set()
    left: list[int] = []
    try:
        wait_until(lambda: len(_event_lines(out)) >= 10 or demo.poll() is not None, 240,
                   "the demo to print 10 events")
        assert demo.poll() is None, err.read_text()
        started = _descendants(demo.pid)
        assert started, "the demo started mongod and Kafka as child processes"
        stack_dir = re.search(r"broker in (\S+) \.\.\.", err.read_text())
        assert stack_dir is not None, err.read_text()
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=120) == 0, err.read_text()
        # The demo stops its servers and reaps them before it exits: nothing may be left now.
        left = [pid for pid in started if pid_alive(pid)]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid in started:  # clean up after a failure only: what the demo left, by pid
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"processes the demo started and left running: {left}"
    assert not Path(stack_dir[1]).exists(), "the demo's temporary folder is removed"
    assert "interrupted, stopping" in err.read_text()

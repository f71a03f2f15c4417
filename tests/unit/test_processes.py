"""relay.dev.processes: a pause returns once the process is stopped, and refuses a dead one."""

from __future__ import annotations

import sys

import psutil
import pytest

from relay.dev.processes import DevStackError, ManagedProcess


def test_pause_returns_with_the_process_stopped_and_resume_lets_it_run(tmp_path):
    process = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log")
    process.start()
    try:
        assert process.pid is not None
        process.pause()
        assert psutil.Process(process.pid).status() == psutil.STATUS_STOPPED
        process.resume()
        assert psutil.Process(process.pid).status() != psutil.STATUS_STOPPED
    finally:
        process.kill()
    assert not process.alive


def test_pausing_a_process_that_is_not_running_says_so(tmp_path):
    process = ManagedProcess("quick", [sys.executable, "-c", "pass"], tmp_path / "log")
    process.start()
    assert process.popen is not None
    process.popen.wait(timeout=30)
    with pytest.raises(DevStackError, match="cannot pause quick: it is not running"):
        process.pause()

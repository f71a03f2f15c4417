"""Processes that die with the process that started them, however it dies.

A process that starts servers (the tests' workers, `demo`, the benchmarks) registers each child's
process id with its **reaper**: one small watchdog process per parent, started on the first
`watch()`, that reads the registrations from a pipe. The parent alone holds the pipe's write end,
so the reaper reads end-of-file exactly when the parent is gone (an exit, an exception, SIGKILL);
it then SIGKILLs every registered child still running, the child's whole process group when the
child leads one (servers start in their own session: a Spark daemon's executors go with it), and
exits. A process id is signalled only if its start time is still the registered one: a child that
ended and whose id was recycled is never hit.

PR_SET_PDEATHSIG alone would not do: the kernel sends it when the *thread* that forked the child
ends, and servers are started from short-lived threads too. It is used for the other half:
`die_with_parent()` makes a pytest worker end when its controller does, so its reaper then reaps.

`dev up`'s detached stack outlives the command on purpose: it `release()`s its servers.

Run as a program (`python reaper.py`, no package import: it starts in milliseconds), this module
is the reaper itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import IO

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_lock = threading.Lock()
_pipe: IO[str] | None = None
_owner: int | None = None  # the process id that started the reaper (a fork must start its own)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _send(line: str) -> None:
    global _pipe, _owner
    with _lock:
        if _pipe is None or _owner != os.getpid():
            reaper = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )  # a Ctrl-C to our group must not end it first
            _pipe, _owner = reaper.stdin, os.getpid()
        assert _pipe is not None
        with contextlib.suppress(BrokenPipeError):
            _pipe.write(line + "\n")
            _pipe.flush()


def watch(pid: int) -> None:
    """SIGKILL `pid` (its process group if it leads one) when this process dies before `release(pid)`."""
    started = _start_time(pid)
    if started is not None:
        _send(f"watch {pid} {started}")


def release(pid: int) -> None:
    """Forget `pid`: it was stopped, or it is meant to outlive this process (`dev up`)."""
    if _pipe is not None and _owner == os.getpid():
        _send(f"release {pid} -")


def die_with_parent() -> None:
    """End this process (SIGKILL) when its parent ends; at once if the parent is already gone."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _reap(watched: dict[int, str]) -> None:
    for pid, started in watched.items():
        if _start_time(pid) != started:
            continue  # already gone, or the id now belongs to another process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def _main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watched: dict[int, str] = {}
    for line in sys.stdin:  # end-of-file: the parent is gone
        verb, pid, started = line.split()
        if verb == "watch":
            watched[int(pid)] = started
        else:
            watched.pop(int(pid), None)
    _reap(watched)


if __name__ == "__main__":
    _main()

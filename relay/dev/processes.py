"""Server processes the dev stack and the tests start: started in their own session, signalled
by process id only (never by name), waited for on loopback ports, and killed with the process
that started them however it dies (relay.dev.reaper)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from tenacity import wait_fixed

from relay.core.errors import Action, RelayError
from relay.core.retry import retrying
from relay.dev import reaper


class DevStackError(RelayError):
    """Raised when a local server (mongod, Kafka, a Schema Registry) cannot be prepared or started."""

    action = Action.STOP


def free_port() -> int:
    """A TCP port free on the loopback interface right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def spawn(argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **popen)`, the child watched by this process's reaper: it is
    SIGKILLed (with its process group when it leads one) if this process dies before stopping it."""
    process: subprocess.Popen[bytes] = subprocess.Popen(argv, **popen)
    reaper.watch(process.pid)
    return process


@dataclass
class ManagedProcess:
    """A server process we started; all signals go to its process id."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    env: dict[str, str] | None = None  # the environment to start it with; None: this process's

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = spawn(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env,
            )
        self.pid = self.popen.pid

    def detach(self) -> None:
        """Let the process outlive this one (`dev up`): its reaper forgets it."""
        if self.pid is not None:
            reaper.release(self.pid)

    @property
    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def signal(self, sig: int) -> None:
        if self.pid is not None and self.alive:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, then reap."""
        self.signal(signal.SIGKILL)
        self._wait(10)

    def pause(self) -> None:
        """SIGSTOP, returning once the kernel shows the process stopped (a fault aimed at "while
        paused" then lands there). Raises DevStackError if it is not running."""
        if self.pid is None or not self.alive:
            raise DevStackError(f"cannot pause {self.name}: it is not running")
        pause_pid(self.pid)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (after SIGCONT, in case it is paused), then SIGKILL if it lingers."""
        if not self.alive:
            self._wait(0)
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if not self._wait(timeout):
            self.kill()

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive:
            if time.monotonic() >= deadline:
                return False
            if self.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.1)
            else:
                time.sleep(0.1)
        return True

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def pause_pid(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and wait until its state is stopped: kill() returns once the signal is
    queued, and the process may run on for a moment (more so on a loaded machine)."""
    os.kill(pid, signal.SIGSTOP)
    process = psutil.Process(pid)

    def stopped() -> None:
        if (status := process.status()) != psutil.STATUS_STOPPED:
            raise DevStackError(f"process {pid} was sent SIGSTOP but is still {status} after {timeout:.0f} s")

    retrying(lambda exc: isinstance(exc, DevStackError), give_up_after_s=timeout, wait=wait_fixed(0.01))(stopped)


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie counts as gone)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def wait_until(what: str, check: Any, timeout: float, proc: ManagedProcess) -> None:
    """Return once `check()` is true; DevStackError with the log's tail when `proc` exits or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive:
            raise DevStackError(f"{what} exited during start-up; log {proc.log_path}:\n{proc.log_tail()}")
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            pass
        if time.monotonic() >= deadline:
            raise DevStackError(f"{what} not ready after {timeout:.0f}s; log {proc.log_path}:\n{proc.log_tail()}")
        time.sleep(0.2)

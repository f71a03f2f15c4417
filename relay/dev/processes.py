"""Server processes the dev stack and the tests start: started in their own session, signalled
by process id only (never by name), waited for on loopback ports, and killed with the process
that started them however it dies (relay.dev.reaper).

A server's ports come from relay.dev.ports (reserved, outside the ephemeral range); a server that
still finds one taken when it binds is started again on fresh ports (`start_on_free_ports`), and
every failed start is one line naming the server's log."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from tenacity import RetryCallState, wait_fixed

from relay.core.retry import retrying
from relay.dev import ports, reaper
from relay.dev.errors import DevStackError, JavaMissingError, PortTakenError

__all__ = [
    "DevStackError",
    "JavaMissingError",
    "ManagedProcess",
    "PortTakenError",
    "free_port",
    "java",
    "pause_pid",
    "pid_alive",
    "port_open",
    "spawn",
    "start_on_free_ports",
    "wait_until",
]

PORT_TRIES = 3  # starts of one server on fresh ports before a taken port stops it

# What a server's log says when it cannot bind its port: mongod ("Error setting up listener ...
# Address already in use"), Kafka ("Socket server failed to bind to 127.0.0.1:P: Address already
# in use"), the JVM ("java.net.BindException"), Quarkus ("Port P seems to be in use"), RabbitMQ
# (Erlang's "eaddrinuse" for its AMQP listener, "dist_port_already_used,P"), and epmd started with
# -d ("there is already a epmd running at port P": something answers there).
_BIND_FAILED = re.compile(
    r"[Aa]ddress already in use|[Ff]ailed to bind|BindException|Port \d+ seems to be in use|eaddrinuse"
    r"|dist_port_already_used|already a epmd running"
)
_ERROR_LINE = re.compile(r"error|exception|fatal|\"s\":\"[EF]\"", re.IGNORECASE)


def free_port() -> int:
    """A port reserved for this process until it exits, outside the ephemeral range
    (relay.dev.ports.held_port): for a server started without a reservation of its own (a relay's
    HTTP port, a Spark daemon) and for an address nothing must answer on."""
    return ports.held_port()


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def java(what: str = "the Kafka broker") -> str:
    """The `java` the JVM servers run with: $JAVA_HOME/bin/java, else the one on PATH.
    JavaMissingError (exit 2) when there is none, or it says it is older than 17."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not found or not os.access(found, os.X_OK):
        where = f"JAVA_HOME={home} holds no bin/java" if home else "no `java` on PATH"
        raise JavaMissingError(f"Java 17 or newer is needed to run {what}: {where} (install a JDK, or set JAVA_HOME)")
    major = _java_major(found)
    if major is not None and major < 17:
        raise JavaMissingError(f"Java 17 or newer is needed to run {what}: {found} is Java {major}")
    return found


@functools.cache
def _java_major(java: str) -> int | None:
    """The major version `java -version` prints (8 for "1.8.0_402"); None when it says none."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


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
    # Descriptors the server inherits: its ports' reservations (relay.dev.ports), whose locks it
    # then holds for as long as it runs, after this process is gone too (a detached `dev up`).
    pass_fds: Sequence[int] = ()
    log_start: int = 0  # the log's size when this start began: what it wrote comes after

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.log_start = log.tell()
            self.popen = spawn(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env,
                pass_fds=tuple(self.pass_fds),
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

    def log_since_start(self, limit: int = 256 * 1024) -> str:
        """What this start wrote to the log (its last `limit` bytes)."""
        try:
            with open(self.log_path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(self.log_start, size - limit))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def ended_how(self) -> str:
        code = self.popen.poll() if self.popen is not None else None
        return f"exit code {code}" if code is not None else "ended"


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


def wait_until(what: str, check: Any, timeout: float, proc: ManagedProcess, ports: Sequence[int] = ()) -> None:
    """Return once `check()` is true. PortTakenError when the log shows the server could not bind
    one of `ports`; DevStackError when `proc` exits or `timeout` seconds pass; each one line
    naming the log."""
    deadline = time.monotonic() + timeout
    while True:
        alive = proc.alive
        if ports:
            taken = bind_failure(proc.log_since_start(), ports)
            if taken is not None:
                raise PortTakenError(what, taken, proc.log_path)
        if not alive:
            raise DevStackError(
                f"{what} exited during start-up ({proc.ended_how()}); log {proc.log_path}: {_last_error(proc)}"
            )
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            pass
        if time.monotonic() >= deadline:
            raise DevStackError(f"{what} not ready after {timeout:.0f} s; log {proc.log_path}: {_last_error(proc)}")
        time.sleep(0.2)


def bind_failure(log: str, ports: Sequence[int]) -> int | None:
    """The port a server's log says it could not bind: the first of `ports` a bind failure's line
    names, else the first of `ports`; None when the log shows no bind failure."""
    failures = [line for line in log.splitlines() if _BIND_FAILED.search(line)]
    if not failures:
        return None
    named = (int(n) for line in failures for n in re.findall(r"\d+", line) if int(n) in ports)
    return next(named, ports[0] if ports else 0)


def _last_error(proc: ManagedProcess) -> str:
    """The log's last line that reads like an error (else its last line), shortened."""
    lines = [line.strip() for line in proc.log_since_start().splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    line = (errors or lines or ["(empty)"])[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def start_on_free_ports(attempt: Callable[[], None], fresh: bool, tries: int = PORT_TRIES) -> None:
    """Run `attempt` (take the server's ports, start it, wait until it serves). When it raises
    PortTakenError and the server is `fresh` (no data or client knows its ports yet), run it
    again: at most `tries` starts in all, then the last PortTakenError, saying so. A restart is
    not retried: its PortTakenError says it keeps its ports. `attempt` leaves nothing running when
    it raises, and refuses the taken port (relay.dev.ports.Ports.refuse) so the next start takes
    another."""

    def gave_up(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        assert isinstance(error, PortTakenError), "only a taken port is retried"
        raise error.after(tries) from error

    try:
        retrying(lambda exc: fresh and isinstance(exc, PortTakenError), attempts=tries, gave_up=gave_up)(attempt)
    except PortTakenError as exc:
        if fresh:
            raise
        raise exc.kept() from exc


class OneProcess:
    """What a server run as one ManagedProcess (`process`, None until its first start) passes on
    to that process, by its id: SIGKILL (nothing flushed, the data as the crash left it; `start()`
    brings it back on the same data), SIGSTOP, SIGCONT, and leaving it running on exit."""

    process: ManagedProcess | None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def pause(self) -> None:
        if self.process is not None:
            self.process.pause()

    def resume(self) -> None:
        if self.process is not None:
            self.process.resume()

    def detach(self) -> None:
        if self.process is not None:
            self.process.detach()

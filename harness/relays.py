"""Running the relay under test: in this process (`RelayThread`), or as a child process stopped
by its pid (`RelayProcess`, on `ChildProcess`) with the RELAY_* environment that reproduces its
settings (`settings_env`)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Self

from harness import ROOT
from relay.config import Settings, env_name, kafka_env_name
from relay.dev.processes import pause_pid, spawn
from relay.wiring import build


class RelayThread:
    """The relay in this process, for tests that do not kill it (and for the benchmarks).

    `relay`: a relay built elsewhere (the benchmarks build theirs in one place); without it,
    `build(settings, **kwargs)` (a group of partition relays with RELAY_PARTITIONS > 1). As a
    context manager: started on enter, stopped on exit.
    """

    def __init__(self, settings: Settings, relay: Any = None, **kwargs: Any) -> None:
        self.relay = relay if relay is not None else build(settings, **kwargs)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"relay-{settings.database}", daemon=True)

    def _run(self) -> None:
        try:
            self.relay.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    def check_alive(self) -> None:
        """Raise if the relay thread ended (it only ends on `stop()` or an error)."""
        if not self.thread.is_alive():
            raise RuntimeError(f"the relay stopped: {self.error!r}") from self.error

    def stop(self, timeout: float = 60) -> bool:
        """Ask the relay to stop and wait for its thread; False if it is still running."""
        self.relay.stop()
        if self.thread.is_alive():
            self.thread.join(timeout=timeout)
        return not self.thread.is_alive()

    def __enter__(self) -> RelayThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.stop(), "relay did not stop"

    def metric(self, name: str, **labels: str) -> float:
        """The relay's samples of `name` with these labels, summed over the labels not given (the
        `outbox` of a relay of one outbox, say), as /metrics would show them (0 when absent)."""
        return float(
            sum(
                s.value
                for m in self.relay.observer.registry.collect()
                for s in m.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
            )
        )

    def metric_labels(self, name: str, label: str) -> set[str]:
        """The values of `label` among the non-zero samples of `name`."""
        return {
            s.labels[label]
            for m in self.relay.observer.registry.collect()
            for s in m.samples
            if s.name == name and s.value
        }


def settings_env(settings: Settings) -> dict[str, str]:
    """The RELAY_* environment that reproduces `settings` in a child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    for f in dataclasses.fields(Settings):
        if f.name == "kafka":
            continue
        env[env_name(f.name)] = str(getattr(settings, f.name))
    for key, value in settings.kafka.items():
        env[kafka_env_name(key)] = value
    env["PYTHONPATH"] = str(ROOT)
    return env


class ChildProcess:
    """A child process of the test, logging to `log_path`, stopped by its pid: SIGTERM (after
    SIGCONT, in case it is paused), SIGKILL when it does not end within 30 s. Subclasses say what
    to start (`argv`) and with which environment (`environ`)."""

    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def environ(self) -> dict[str, str]:
        raise NotImplementedError

    def start(self) -> Self:
        with open(self.log_path, "ab") as log:
            self.proc = spawn(self.argv(), env=self.environ(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP; returns once the process is stopped."""
        if self.proc is None or not self.alive:
            raise AssertionError(f"{self.log_path.stem} is not running (exit {self.returncode}):\n{self.log()[-3000:]}")
        pause_pid(self.proc.pid)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended; None while it runs (or before it started)."""
        return None if self.proc is None else self.proc.poll()

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            try:
                self.terminate(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class RelayProcess(ChildProcess):
    """`outbox-relay run` as a child process, for kill and signal tests (stopped by pid).

    `module` is what `python -m <module> run` starts: `relay`, or a test wrapper that changes
    the relay's timing (tests/faults/slow_commit.py)."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        name: str,
        extra_env: dict[str, str] | None = None,
        module: str = "relay",
    ) -> None:
        self.settings = settings
        self.extra_env = extra_env or {}
        self.module = module
        self.log_path = log_dir / f"{name}.log"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, "run"]

    def environ(self) -> dict[str, str]:
        return settings_env(self.settings) | self.extra_env

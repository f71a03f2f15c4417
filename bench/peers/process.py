"""What every peer process shares: a temporary folder, a log, and stopping by process id."""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from relay.dev.stack import ManagedProcess


class PeerError(RuntimeError):
    """A peer could not be resolved, built, started, or stopped working; the message says why."""


class PeerProcess:
    """Mixin for a peer run as one process in its own temporary folder (`work_dir`), logging to
    `work_dir / LOG_NAME`; use as a context manager. `stop()` stops the process by its pid
    (SIGTERM, SIGKILL after 30 s), then any of its child processes still running, by theirs;
    copies the log to `keep_log` (if set) and deletes the folder. Subclasses set `process` in
    `start()`."""

    LOG_NAME = "peer.log"
    work_dir: Path
    keep_log: Path | None
    process: ManagedProcess | None

    @property
    def log_path(self) -> Path:
        return self.work_dir / self.LOG_NAME

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        children: list[psutil.Process] = []
        try:
            if self.process is not None and self.pid is not None:
                try:
                    children = psutil.Process(self.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    pass
                self.process.stop(timeout=30)
                _, alive = psutil.wait_procs(children, timeout=10)
                for child in alive:   # our own children, by pid
                    child.kill()
        finally:
            if self.keep_log is not None and self.log_path.exists():
                self.keep_log.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.log_path, self.keep_log)
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The relay as deployed: `python -m relay run` in a process of its own, from a chosen code tree.

The steady-state steps run the relay this way, as each peer runs in its own JVM: nothing of the
benchmark (its sampler, its live consumer, the writer's pipe) shares the relay's interpreter, and
the CPU and RSS measured are the relay's alone. `code` is the folder whose `relay` package runs
(default: this checkout), so `bench.ab` can run two commits side by side on one stack. The
process gets only the settings named here, so an older commit that lacks a newer setting still
starts; its own share (`relay_read_to_ack_seconds`) is read from its /metrics endpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from relay.dev.processes import free_port, spawn

ROOT = Path(__file__).resolve().parent.parent
OWN_SHARE = "relay_read_to_ack_seconds"
Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), ascending, +Inf last


class RelayChild:
    """One `python -m relay run` child started from `code` with `env` (RELAY_* settings), logging
    to a temporary file; stopped by its pid (SIGTERM, SIGKILL after 30 s)."""

    def __init__(self, env: dict[str, str], code: Path = ROOT, name: str = "relay") -> None:
        self.code = code
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        self.env.update(env, RELAY_HTTP_PORT=str(self.port), PYTHONPATH=str(code))
        self.log_path = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> RelayChild:
        with open(self.log_path, "ab") as log:
            self.proc = spawn([sys.executable, "-m", "relay", "run"], cwd=self.code, env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def check_alive(self) -> None:
        """Raise, with the end of its log, if the process ended."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the relay process ended: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def buckets(self, name: str = OWN_SHARE) -> Buckets:
        """A histogram's cumulative buckets (summed over its label sets) from /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        summed: dict[float, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == f"{name}_bucket":
                    bound = float(s.labels["le"])
                    summed[bound] = summed.get(bound, 0.0) + s.value
        return sorted(summed.items())

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # our own child, by its pid
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> RelayChild:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

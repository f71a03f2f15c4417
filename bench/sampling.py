"""Process facts through psutil: CPU time, RSS and peak RSS of named processes, host CPU.

`Sampler` watches a few *roles* (e.g. "bench" = this process, "mongod", "kafka", "peer"),
each a process id, optionally with its child processes (a Conduit peer runs its connector as
a child). While it runs, a thread samples every role's RSS every 25 ms; `stop()` returns a
`Usage`: per role the CPU time used in the interval and the highest RSS seen, plus how much
CPU the rest of the machine took meanwhile.

Peak RSS is the highest *sampled* RSS (psutil has no Linux peak-RSS field, VmHWM): a peak
shorter than 25 ms can be missed. For this process the kernel's own peak (`ru_maxrss`) is
reported beside it by `self_peak_rss_mb`.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

Roles = Callable[[], Mapping[str, int | None]]

MB = 1024 * 1024
IDLE_CORES = 0.15       # mongod and the broker together, below which they count as idle
IDLE_TIMEOUT_S = 90.0
log = logging.getLogger("bench")


def self_peak_rss_mb() -> float:
    """This process's peak RSS so far as the kernel counts it (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb(pid: int | None = None) -> float:
    """RSS of `pid` (default: this process) now, in MB; NaN if it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss / MB
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return math.nan


@dataclass
class Usage:
    """What the roles used during one interval (see `Sampler`)."""

    seconds: float
    cpu_s: dict[str, float] = field(default_factory=dict)         # user + system, children included
    peak_rss_mb: dict[str, float] = field(default_factory=dict)   # highest sampled RSS (tree)
    rss_start_mb: dict[str, float] = field(default_factory=dict)
    rss_end_mb: dict[str, float] = field(default_factory=dict)
    # Host-wide, in cores (CPU seconds per second of the interval): busy time of every process
    # not in a role (other users, other test runs; near 0 on a quiet machine), and idle time
    # spent waiting for the disk.
    other_cores: float = math.nan
    iowait_cores: float = math.nan
    host_busy_cores: float = math.nan

    def cpu_us_per_event(self, role: str, events: int) -> float:
        cpu = self.cpu_s.get(role, math.nan)
        return cpu / events * 1e6 if events > 0 else math.nan


def _host_times() -> tuple[float, float]:
    """(busy, iowait) CPU seconds of the whole host since boot."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)
    return busy, t.iowait


class Sampler:
    """Samples the roles' processes; a context manager whose `usage` is set on exit.

    `roles()` is asked on every sample, so a process started after the sampler (a peer's
    JVM) is picked up when it appears and its CPU counts from its start. Roles in `trees`
    include their child processes, recursively.
    """

    def __init__(self, roles: Roles, trees: frozenset[str] = frozenset(), interval_s: float = 0.025) -> None:
        self._roles = roles
        self._trees = trees
        self._interval_s = interval_s
        self._procs: dict[int, psutil.Process] = {}
        self._first_cpu: dict[int, float] = {}     # pid -> CPU seconds when first seen (0 if born later)
        self._last_cpu: dict[int, float] = {}
        self._role_pids: dict[str, set[int]] = {}
        self._peak: dict[str, float] = {}
        self._start_rss: dict[str, float] = {}
        self._last_rss: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._started = 0.0
        self._host_start = (0.0, 0.0)
        self.usage: Usage | None = None

    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return None
            self._procs[pid] = proc
        return proc

    def _sample(self, first: bool) -> None:
        with self._lock:
            for role, pid in self._roles().items():
                root = self._process(pid) if pid else None
                if root is None:
                    continue
                procs = [root]
                if role in self._trees:
                    try:
                        procs += root.children(recursive=True)
                    except psutil.NoSuchProcess:
                        pass
                rss = 0.0
                for proc in procs:
                    try:
                        with proc.oneshot():
                            cpu = proc.cpu_times()
                            rss += proc.memory_info().rss / MB
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
                    seconds = cpu.user + cpu.system
                    self._first_cpu.setdefault(proc.pid, seconds if first else 0.0)
                    self._last_cpu[proc.pid] = seconds
                    self._role_pids.setdefault(role, set()).add(proc.pid)
                self._peak[role] = max(self._peak.get(role, 0.0), rss)
                if first:
                    self._start_rss[role] = rss
                self._last_rss[role] = rss

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample(first=False)

    def __enter__(self) -> Sampler:
        self._host_start = _host_times()
        self._started = time.monotonic()
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> Usage:
        """Stop sampling (idempotent); take a last sample and return the interval's `Usage`."""
        if self.usage is not None:
            return self.usage
        self._stop.set()
        self._thread.join()
        self._sample(first=False)
        seconds = time.monotonic() - self._started
        busy, iowait = _host_times()
        usage = Usage(seconds=seconds, peak_rss_mb=dict(self._peak), rss_start_mb=dict(self._start_rss),
                      rss_end_mb=dict(self._last_rss))
        ours = 0.0
        for role, pids in self._role_pids.items():
            usage.cpu_s[role] = sum(self._last_cpu[p] - self._first_cpu[p] for p in pids)
            ours += usage.cpu_s[role]
        if seconds > 0:
            usage.host_busy_cores = (busy - self._host_start[0]) / seconds
            usage.other_cores = max(0.0, usage.host_busy_cores - ours / seconds)
            usage.iowait_cores = (iowait - self._host_start[1]) / seconds
        self.usage = usage
        return usage


def _nats_pid(stack: Any) -> int | None:
    """The pid of the stack's nats-server (bench.stack.BenchStack), if it runs one."""
    server = getattr(stack, "nats_server", None)
    process = server.process if server is not None else None
    return process.pid if process is not None else None


_beam: dict[int, int] = {}  # rabbitmq-server script's pid -> its Erlang VM's


def _rabbitmq_pid(stack: Any) -> int | None:
    """The pid of the Erlang VM (beam.smp) of the stack's rabbitmq-server (bench.stack.BenchStack),
    if it runs one: the node's process is a shell script waiting on it, which uses no CPU."""
    server = getattr(stack, "rabbitmq_server", None)
    process = server.process if server is not None else None
    if process is None or process.pid is None:
        return None
    if process.pid not in _beam:
        try:
            found = [p for p in psutil.Process(process.pid).children(recursive=True) if "beam" in p.name()]
        except psutil.Error:
            return None
        if not found:
            return None
        _beam[process.pid] = found[0].pid
    return _beam[process.pid]


def stack_roles(stack: Any, extra: Roles | None = None) -> Roles:
    """Roles of a `relay.dev.stack.LocalStack` run: this process ("bench"), mongod, the broker,
    the nats-server when the stack runs one ("nats"), the rabbitmq-server's Erlang VM when it runs
    one ("rabbitmq"), plus `extra()` (e.g. a peer's process, known only once it is started)."""
    def roles() -> dict[str, int | None]:
        mongo = [p.pid for p in stack.mongo.processes if p is not None]
        kafka = stack.kafka.process
        nats, rabbitmq = _nats_pid(stack), _rabbitmq_pid(stack)
        return {"bench": os.getpid(), "mongod": mongo[0] if mongo else None,
                "kafka": kafka.pid if kafka is not None else None, **({"nats": nats} if nats else {}),
                **({"rabbitmq": rabbitmq} if rabbitmq else {}), **(extra() if extra else {})}
    return roles


def wait_idle(stack: Any) -> float:
    """Wait until mongod and the brokers of a `LocalStack` (Kafka, and the nats-server and the
    rabbitmq-server when it runs them) use less than IDLE_CORES together (measured over 1 s; not a
    fixed sleep); return their last CPU, in cores."""
    pids = [p.pid for p in stack.mongo.processes] + [stack.kafka.process.pid if stack.kafka.process else None,
                                                     _nats_pid(stack), _rabbitmq_pid(stack)]
    procs = [psutil.Process(pid) for pid in pids if pid is not None]
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    cores = math.nan
    while time.monotonic() < deadline:
        before = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        time.sleep(1.0)
        cores = sum(p.cpu_times().user + p.cpu_times().system for p in procs) - before
        if cores < IDLE_CORES:
            return cores
    log.warning("servers not idle after %.0f s (%.2f cores): running anyway", IDLE_TIMEOUT_S, cores)
    return cores

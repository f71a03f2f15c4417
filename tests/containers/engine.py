"""A container engine for the container tests (test set-up only; users' machines have Docker).

`Engine.find()` takes a working Docker (`docker info`), else Debian's podman: installed with
apt-get when missing (root and apt-get needed), run through a runc wrapper, because this sandbox
refuses the OCI runtime's setrlimit for RLIMIT_NOFILE/NPROC ("OCI permission denied"); the wrapper
deletes `process.rlimits` from the bundle's config.json (`create`/`run`) and from the `--process`
file (`exec`, so `podman exec` and health checks), then execs runc. `Engine.serve()` starts
`podman system service` on a socket (the Docker API, for testcontainers and podman-compose):
`Service.stop()` stops it by pid at the end of the session; it also ends when the process that
started it dies (PR_SET_PDEATHSIG) or after SERVICE_IDLE_S without a request. Everything lives
under `state_dir()` (the project's cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from relay.cachedir import cache_dir
from relay.dev.processes import spawn

APT_PACKAGES = ("podman", "buildah", "mmdebstrap", "runc")

_WRAPPER = r'''#!/usr/bin/env python3
"""runc, minus process.rlimits (this sandbox refuses setrlimit NOFILE/NPROC). Test set-up only."""
import json, os, sys

def strip(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return
    proc = doc.get("process", doc)
    if proc.pop("rlimits", None) is not None:
        with open(path, "w") as f:
            json.dump(doc, f)

args = sys.argv[1:]
for i, arg in enumerate(args):
    if arg in ("--bundle", "-b") and i + 1 < len(args):
        strip(os.path.join(args[i + 1], "config.json"))
    elif arg.startswith("--bundle="):
        strip(os.path.join(arg.split("=", 1)[1], "config.json"))
    elif arg in ("--process", "-p") and i + 1 < len(args):
        strip(args[i + 1])
    elif arg.startswith("--process="):
        strip(arg.split("=", 1)[1])
if "create" in args or "run" in args:
    strip("config.json")  # runc's default bundle is the working directory
os.execvp("runc", ["runc"] + args)
'''


# `podman system service` ends after this long without a request (and when its pytest worker dies,
# or at the end of the session, stopped by pid).
SERVICE_IDLE_S = 1800


class EngineUnavailable(Exception):
    """Raised when no container engine can be had here; the message is the one-line reason."""


def state_dir() -> Path:
    path = cache_dir() / "containers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _works(argv: list[str], env: dict[str, str] | None = None) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=60, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def install_podman() -> None:
    """apt-get install podman, buildah, mmdebstrap and runc (root and apt-get needed)."""
    missing = [p for p in APT_PACKAGES if shutil.which(p) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineUnavailable(f"no Docker engine, and {', '.join(missing)} cannot be installed (needs root and apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
        except subprocess.TimeoutExpired:
            raise EngineUnavailable(f"`{' '.join(argv)}` took more than 20 minutes") from None
        if done.returncode != 0:
            reason = " ".join(done.stderr.strip().splitlines()[-2:])[-300:]
            raise EngineUnavailable(f"`{' '.join(argv)}` failed (exit {done.returncode}): {reason}")


def _podman_config() -> Path:
    """containers.conf selecting the runc wrapper (CONTAINERS_CONF: the CLI, the service and
    podman-compose read it)."""
    wrapper = state_dir() / "runc-no-rlimits"
    wrapper.write_text(_WRAPPER)
    wrapper.chmod(0o755)
    conf = state_dir() / "containers.conf"
    conf.write_text(f'[engine]\nruntime = "runc-no-rlimits"\n\n[engine.runtimes]\n"runc-no-rlimits" = ["{wrapper}"]\n')
    return conf


@dataclass
class Service:
    """`podman system service` on a Unix socket, stopped by pid."""

    process: subprocess.Popen[bytes]
    socket: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.socket.parent, ignore_errors=True)


@dataclass
class Engine:
    """The engine's command line (`docker` or `podman`) and the environment it needs."""

    kind: str  # "docker" or "podman"
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def find(cls, install: bool = True) -> Engine:
        """A working Docker, else podman (installed when `install` and possible); raises
        EngineUnavailable with the reason."""
        if shutil.which("docker") and _works(["docker", "info"]):
            return cls("docker")
        if install:
            install_podman()
        if shutil.which("podman") is None:
            raise EngineUnavailable("no Docker engine (`docker info` fails) and no podman")
        engine = cls("podman", {"CONTAINERS_CONF": str(_podman_config())})
        if not _works(["podman", "info"], engine.environ()):
            raise EngineUnavailable("podman is installed but `podman info` fails")
        return engine

    def environ(self) -> dict[str, str]:
        return dict(os.environ, **self.env)

    def run(self, *args: str, check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        """`docker|podman ARGS`, output captured; raises CalledProcessError (with its output)."""
        done = subprocess.run([self.kind, *args], capture_output=True, text=True, env=self.environ(), timeout=timeout)
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done

    def image_exists(self, ref: str) -> bool:
        return self.run("image", "inspect", ref, check=False).returncode == 0

    def size_mb(self, ref: str) -> float:
        """The image's size in MB (10^6 bytes; the engine's own figure); nan when it is missing."""
        done = self.run("image", "inspect", "--format", "{{.Size}}", ref, check=False)
        text = done.stdout.strip()
        return float(text) / 1e6 if done.returncode == 0 and text.isdigit() else float("nan")

    def inspect(self, ref: str, what: str = "image") -> dict[str, object]:
        return dict(json.loads(self.run(what, "inspect", ref).stdout)[0])

    def serve(self) -> tuple[str, Service | None]:
        """The Docker API's address (for DOCKER_HOST) and, for podman, the service to stop."""
        if self.kind == "docker":
            return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"), None
        sock = Path(tempfile.mkdtemp(prefix="relay-podman-")) / "podman.sock"
        process = spawn(  # killed with this process however it ends (relay.dev.reaper)
            ["podman", "system", "service", "--time", str(SERVICE_IDLE_S), f"unix://{sock}"],
            env=self.environ(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not sock.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                Service(process, sock).stop()
                raise EngineUnavailable("podman system service did not open its socket")
            time.sleep(0.1)
        return f"unix://{sock}", Service(process, sock)

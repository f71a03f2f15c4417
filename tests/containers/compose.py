"""docker-compose.yml run for real: `docker compose` with Docker, else podman-compose (PyPI).

The server images are the stand-ins (tests.containers.servers) through MONGO_IMAGE/KAFKA_IMAGE,
the relay image is the one the session built (tagged as compose's `outbox-relay:local`, so `up`
does not build again), host ports are free ones, and the project name is unique; `down -v`
removes the containers, the network and the volumes.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
import warnings
from pathlib import Path

from relay.dev.processes import free_port
from tests.containers.engine import Engine
from tests.containers.images import ROOT

COMPOSE_RELAY_IMAGE = "outbox-relay:local"


class ComposeStack:
    def __init__(self, engine: Engine, images: dict[str, str]) -> None:
        self.engine = engine
        self.project = f"relay-test-{uuid.uuid4().hex[:6]}"
        self.ports = {name: free_port() for name in ("MONGO_HOST_PORT", "KAFKA_HOST_PORT", "RELAY_HOST_PORT")}
        self.env = engine.environ() | images | {k: str(v) for k, v in self.ports.items()}
        tool = Path(sys.executable).parent / "podman-compose"
        base = ["docker", "compose"] if engine.kind == "docker" else [str(tool)]
        self.argv = [*base, "-p", self.project, "-f", str(ROOT / "docker-compose.yml")]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.argv, *args], capture_output=True, text=True, env=self.env, cwd=ROOT,
                              timeout=timeout)

    def up(self, *services: str) -> subprocess.CompletedProcess[str]:
        done = self.run("up", "-d", "--no-build", *services)  # services may start with --no-deps
        if done.returncode != 0:
            raise AssertionError(f"compose up failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def up_in_order(self) -> None:
        """`up`. With podman 4.3, in the file's dependency order, one step at a time, with
        `--no-deps`: podman 4.3 fails to start a container whose `--requires` chain holds an exited
        one ("generating dependency graph ... not found in input list": relay -> mongo-init ->
        mongo), and runs no health checks without systemd (podman-compose then ignores
        `condition: service_healthy`). With Docker, one `docker compose up` does it all."""
        if self.engine.kind == "docker":
            self.up()
            return
        self.up("--no-deps", "mongo", "kafka")
        self.up("--no-deps", "mongo-init")
        init = self.engine.run("wait", f"{self.project}_mongo-init_1", timeout=180).stdout.strip()
        assert init == "0", f"mongo-init exited with {init}:\n{self.run('logs', 'mongo-init').stdout[-2000:]}"
        self.up("--no-deps", "relay", "demo")

    def down(self) -> None:
        """`down -v`; a failure is reported as a warning (in pytest's summary, with the tool's
        output), not raised: the test's own outcome stays the one reported."""
        try:
            done = self.run("down", "-v", "--timeout", "10", timeout=300)
        except subprocess.TimeoutExpired:
            warnings.warn(f"compose down -v of {self.project} took more than 300 s; its containers, network "
                          "or volumes may be left", stacklevel=2)
            return
        if done.returncode != 0:
            warnings.warn(f"compose down -v of {self.project} failed (exit {done.returncode}); its containers, "
                          f"network or volumes may be left:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}",
                          stacklevel=2)

    @property
    def mongodb_uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.ports['MONGO_HOST_PORT']}/?directConnection=true"

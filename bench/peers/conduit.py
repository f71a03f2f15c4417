"""The third peer: Conduit (Go) with its MongoDB connector, built from the Go module proxy.

Build (once, before the stack starts, never timed): `go install <module>@<version>` with
`GOBIN` in the cache (`~/.cache/outbox-relay/bench-peers-conduit-<versions>/`), `GOTOOLCHAIN=local`
(a module needing a newer Go fails instead of downloading a toolchain) and `GOFLAGS=-mod=mod`:
- Conduit itself, `github.com/conduitio/conduit/cmd/conduit` (CONDUIT_VERSION) into `bin/`;
- the standalone MongoDB connector, `github.com/conduitio-labs/conduit-connector-mongo/cmd/connector`
  (MONGO_CONNECTOR_VERSION) into `connectors/`, where Conduit finds standalone connectors.
Versions can be overridden with BENCH_CONDUIT_VERSION / BENCH_CONDUIT_MONGO_VERSION. Nothing
prebuilt is downloaded. A failed build raises `PeerError` with go's own error lines.

Run: one `conduit run` process with one pipeline (configuration file version 2.2): the
MongoDB source (`snapshot: true`: the connector has no "start at this cluster time" setting,
so it reads the backlog by a collection scan in batches of 1000, then switches to the change
stream) and the built-in Kafka destination (`acks: all`) into the benchmark's topic; records
in Conduit's default `opencdc/json` format, key `_id`. Its HTTP and gRPC APIs listen on free
loopback ports; its database (badger) and logs live in a temporary folder; it is stopped by
its pid (SIGTERM, then SIGKILL), its connector child process with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers.process import PeerError, PeerProcess
from relay.dev.stack import ManagedProcess, cache_dir, free_port

CONDUIT_MODULE = "github.com/conduitio/conduit/cmd/conduit"
CONDUIT_VERSION = os.environ.get("BENCH_CONDUIT_VERSION", "v0.21.2")
MONGO_CONNECTOR_MODULE = "github.com/conduitio-labs/conduit-connector-mongo/cmd/connector"
MONGO_CONNECTOR_VERSION = os.environ.get("BENCH_CONDUIT_MONGO_VERSION", "latest")
BUILD_TIMEOUT_S = 1800


def conduit_cache_dir() -> Path:
    return cache_dir() / f"bench-peers-conduit-{CONDUIT_VERSION}-mongo-{MONGO_CONNECTOR_VERSION}"


@dataclass(frozen=True)
class ConduitBinaries:
    conduit: Path
    connectors: Path   # the folder holding the standalone MongoDB connector


def _go_install(module: str, version: str, gobin: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise PeerError("Go is needed to build the Conduit peer (`go` is not on PATH)")
    env = {**os.environ, "GOBIN": str(gobin), "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    try:
        done = subprocess.run([go, "install", f"{module}@{version}"], env=env, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        raise PeerError(f"go install {module}@{version}: not done after {BUILD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        # go repeats the module path in front of the cause: keep the cause ("reading ...: 403 ...").
        # The proxy's address is printed as $GOPROXY (these lines end up in BENCHMARKS.md).
        lines = [re.sub(r"https?://[^/\s]+/", "$GOPROXY/", re.sub(r"^go: .*?: (?=reading |module |no matching)", "",
                                                                   line.strip()))
                 for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise PeerError(f"go install {module}@{version} failed (exit {done.returncode}): " + " | ".join(lines[-4:]))


def build(fetch: bool = True) -> ConduitBinaries:
    """Conduit and its MongoDB connector from the cache, building each missing one once."""
    base = conduit_cache_dir()
    binaries = ConduitBinaries(base / "bin" / "conduit", base / "connectors")
    errors = []
    for module, version, target, gobin in ((CONDUIT_MODULE, CONDUIT_VERSION, binaries.conduit, base / "bin"),
                                           (MONGO_CONNECTOR_MODULE, MONGO_CONNECTOR_VERSION,
                                            binaries.connectors / "connector", binaries.connectors)):
        if target.exists():
            continue
        if not fetch:
            raise PeerError(f"{target} is not built: run `python -m bench.peers fetch`")
        gobin.mkdir(parents=True, exist_ok=True)
        try:
            _go_install(module, version, gobin)
        except PeerError as exc:   # try the other one too: the report names every failure
            errors.append(str(exc))
    if errors:
        raise PeerError("; ".join(errors))
    return binaries


def built_versions(binaries: ConduitBinaries) -> str:
    """The module versions the binaries were built from (`go version -m`), for the report."""
    out = []
    for path in (binaries.conduit, binaries.connectors / "connector"):
        try:
            info = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True, timeout=30)
            mod = next((line.split()[1:3] for line in info.stdout.splitlines() if line.strip().startswith("mod")), [])
            out.append("@".join(mod) if mod else path.name)
        except (OSError, subprocess.SubprocessError):
            out.append(path.name)
    return ", ".join(out)


@dataclass
class ConduitPeer(PeerProcess):
    """One `conduit run` process with the benchmark's pipeline; use as a context manager.

    Same surface as `bench.peers.connect.StandaloneWorker`: `start()`, `pid`, `check_alive()`,
    `connector_started_at()` (None: Conduit is timed from its launch), `stop()`.
    """

    binaries: ConduitBinaries
    mongo_uri: str
    database: str
    collection: str
    bootstrap_servers: str
    topic: str
    keep_log: Path | None = None
    LOG_NAME = "conduit.log"
    work_dir: Path = field(init=False)
    process: ManagedProcess | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.work_dir = Path(tempfile.mkdtemp(prefix="outbox-relay-bench-conduit-"))

    def pipeline(self) -> dict[str, object]:
        return {"version": "2.2", "pipelines": [{
            "id": "bench-conduit", "status": "running",
            "connectors": [
                {"id": "mongo-source", "type": "source", "plugin": "standalone:mongo",
                 "settings": {"uri": self.mongo_uri, "db": self.database, "collection": self.collection,
                              "snapshot": "true", "batchSize": "1000"}},
                {"id": "kafka-destination", "type": "destination", "plugin": "builtin:kafka",
                 "settings": {"servers": self.bootstrap_servers, "topic": self.topic, "acks": "all"}},
            ]}]}

    def start(self) -> None:
        pipelines = self.work_dir / "pipelines"
        pipelines.mkdir()
        # JSON is YAML: the pipeline file needs no YAML writer.
        (pipelines / "bench.yaml").write_text(json.dumps(self.pipeline(), indent=2))
        argv = [str(self.binaries.conduit), "run",
                "--pipelines.path", str(pipelines), "--connectors.path", str(self.binaries.connectors),
                "--processors.path", str(self.work_dir / "processors"),
                "--db.type", "badger", "--db.badger.path", str(self.work_dir / "db"),
                "--http.address", f"127.0.0.1:{free_port()}", "--grpc.address", f"127.0.0.1:{free_port()}",
                "--log.format", "json", "--log.level", "info"]
        self.process = ManagedProcess("conduit", argv, self.log_path)
        self.process.start()

    def check_alive(self) -> None:
        if self.process is None or not self.process.alive:
            raise PeerError(f"Conduit exited; log {self.log_path}:\n{self.log_tail()}")

    def connector_started_at(self) -> float | None:
        return None

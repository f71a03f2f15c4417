"""A local Schema Registry for the dev stack and the tests: Apicurio Registry's Confluent API.

Apicurio Registry publishes a runnable build on Maven Central (`io.apicurio:apicurio-registry-app`,
classifier `all`, type `tar.gz`, a Quarkus application) and serves the Confluent Schema Registry
REST API at `/apis/ccompat/v7`, which confluent-kafka's `SchemaRegistryClient` speaks. Version
3.0.9 is used: the newest on Maven Central that runs on Java 17 (3.3.x is compiled for Java 21);
its archive (109 MB) holds a Quarkus legacy jar (`*-runner.jar` beside `lib/`).

Invariants:
- the archive is resolved with Maven and unpacked into the cache once, on first use (not by
  `make setup`); a folder counts as unpacked only with its `.complete` marker (relay.dev.maven);
- the server listens on a loopback port reserved for it outside the ephemeral range
  (relay.dev.ports; a first start that meets a taken port starts again on a fresh one, a restart
  keeps its port: its clients know the URL), keeps its files in the folder it was given, runs in
  its own session and is stopped by its process id, never by name;
- `start()` returns only once the Confluent API answers; a server that does not come up in time
  raises `DevStackError` naming its log.

Storage is in memory by default (H2 `mem:`); `persistent=True` keeps it in an H2 file under the
folder, so a restarted server (same port, same folder) serves the same ids, as a production
registry with durable storage does. The global compatibility rule is BACKWARD, Confluent's
default (Apicurio's own default is no rule). Schema ids on the Confluent API are Apicurio
*content ids* (one id per distinct schema text, shared by every subject that registers it, as in
Confluent's registry); `legacy_ids=True` switches the API to Apicurio *global ids* (one per
subject version) instead. See docs/schema-registry.md.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.cachedir import cache_dir
from relay.dev import maven
from relay.dev.ports import Ports
from relay.dev.processes import (
    DevStackError,
    ManagedProcess,
    OneProcess,
    PortTakenError,
    java,
    start_on_free_ports,
    wait_until,
)

APICURIO_VERSION = "3.0.9"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
CCOMPAT_PATH = "/apis/ccompat/v7"
_START_TIMEOUT_S = 120.0


def registry_home(fetch: bool = True) -> Path:
    """The unpacked Apicurio Registry build, resolving and unpacking it on first use."""
    home = cache_dir() / f"apicurio-registry-{APICURIO_VERSION}"
    if maven.is_resolved(home):
        return home
    if not fetch:
        raise DevStackError(f"Apicurio Registry not in {home}: run `outbox-relay dev fetch --schema-registry`")
    staging = home.parent / f"{home.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        archive = maven.copy_artifact(ARTIFACT, staging / "download")
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links and paths out of the folder
                tar.extractall(staging, filter="data")
            else:
                tar.extractall(staging)
        shutil.rmtree(staging / "download")
        runner_jar(staging)  # the layout is the one this module knows
    except maven.MavenError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise DevStackError(f"Maven could not resolve {ARTIFACT}:\n{exc}") from exc
    except (OSError, tarfile.TarError, DevStackError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise DevStackError(f"could not unpack {ARTIFACT} into {home}: {exc}") from exc
    (staging / maven.COMPLETE).write_text(ARTIFACT)
    if maven.is_resolved(home):  # another process (a parallel test run) finished first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
        return home
    shutil.rmtree(home, ignore_errors=True)
    staging.rename(home)
    return home


def runner_jar(home: Path) -> Path:
    """The jar to start: `quarkus-run.jar` of a fast-jar build, else the legacy `*-runner.jar`."""
    fast = home / "quarkus-run.jar"
    if fast.exists():
        return fast
    legacy = sorted(home.glob("*-runner.jar"))
    if not legacy:
        raise DevStackError(f"no quarkus-run.jar or *-runner.jar in {home}")
    return legacy[0]


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


@dataclass
class SchemaRegistryServer(OneProcess):
    """One Apicurio Registry process on loopback, serving the Confluent API at `url`."""

    base_dir: Path
    port: int = 0
    persistent: bool = False
    legacy_ids: bool = False
    compatibility: str = "BACKWARD"
    heap: str = "384m"
    process: ManagedProcess | None = None
    _reserved: Ports = field(default_factory=Ports, repr=False, compare=False)

    @property
    def url(self) -> str:
        """The Confluent API's base URL: the value for RELAY_SCHEMA_REGISTRY_URL."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def _argv(self) -> list[str]:
        home = registry_home()
        tmp = self.base_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        storage = f"jdbc:h2:file:{self.base_dir / 'data' / 'registry'}" if self.persistent else "jdbc:h2:mem:registry"
        props = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            "apicurio.datasource.url": storage,
            "apicurio.ccompat.legacy-id-mode.enabled": str(self.legacy_ids).lower(),
            "apicurio.rules.global.compatibility": self.compatibility,
            "apicurio.import.work-dir": str(tmp),
            "apicurio.storage.snapshot.location": str(tmp),
            "java.io.tmpdir": str(tmp),
        }
        return [
            java("the Schema Registry"),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            *(f"-D{k}={v}" for k, v in props.items()),
            "-jar",
            str(runner_jar(home)),
        ]

    def start(self) -> None:
        """Start the server (on the same port and data as before, when restarted) and wait
        until its Confluent API answers."""
        java("the Schema Registry")
        start_on_free_ports(self._start_once, fresh=self.process is None)

    def _start_once(self) -> None:
        """One start on the server's reserved port; nothing left running if it fails."""
        (self.port,) = self._reserved.take([self.port], "the Schema Registry", exact=self.process is not None)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            "schema-registry", self._argv(), self.base_dir / "registry.log", pass_fds=self._reserved.fds
        )
        self.process.start()
        base = f"http://127.0.0.1:{self.port}"
        try:
            wait_until(
                f"Schema Registry on port {self.port}",
                lambda: _answers(f"{base}/health/ready") and _answers(f"{self.url}/subjects"),
                _START_TIMEOUT_S,
                self.process,
                [self.port],
            )
        except BaseException as exc:
            self.process.stop()
            if isinstance(exc, PortTakenError):
                self._reserved.refuse(exc.port)
                self.process = None  # never served: the next start is a first start
            raise

    def stop(self) -> None:
        """Stop the server, and let its port go (a later `start()` wants it again)."""
        if self.process is not None:
            self.process.stop(timeout=30)
        self._reserved.release()

    def __enter__(self) -> SchemaRegistryServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def state(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "port": self.port,
            "pid": self.process.pid if self.process else None,
            "log": str(self.process.log_path) if self.process else None,
        }

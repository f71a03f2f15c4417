"""A real Prometheus for the monitoring tests (test set-up only; tests/integration/test_monitoring.py).

Debian 12's package `prometheus` 2.42 (the server and `promtool`) is fetched from Debian's
mirrors, pinned by SHA-256, and unpacked with dpkg-deb into `<cache>/prometheus-2.42.0/` once
(relay.dev.debian), the way the tests' mongod gets its OpenSSL 1.1. Not `apt-get install`: the
package's maintainer scripts add a system user and start a `prometheus` service listening on every
interface at :9090, which no test machine should get as a side effect, and it would need root. The
two binaries are Go programs that need only libc (amd64, like the tests' mongod).

Invariants (as relay.dev.mongodb): the folder counts as installed only with its `.complete`
marker, written once `prometheus --version` printed the pinned version; a fetch under way is a
`.partial-<pid>` folder nothing reads; of two processes fetching at once (pytest workers) the
first to finish wins.

`PrometheusServer` runs one server on a free loopback port in a folder of the caller's, stopped by
process id (relay.dev.processes.ManagedProcess); `api()` calls its HTTP API.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from relay.cachedir import cache_dir
from relay.dev import debian, maven
from relay.dev.processes import DevStackError, ManagedProcess, free_port, wait_until

VERSION = "2.42.0"
PACKAGE = debian.DebianPackage(
    name="prometheus",
    version="2.42.0+ds-5+deb12u1",
    architecture="amd64",
    pool="main/p/prometheus",
    sha256="81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55",
)
_VERSION_LINE = re.compile(r"^prometheus, version (\d+\.\d+\.\d+)", re.MULTILINE)
_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Prometheus:
    """An unpacked package: `prometheus`, `promtool` and the web assets under `home`."""

    home: Path

    @property
    def server(self) -> Path:
        return self.home / "usr" / "bin" / "prometheus"

    @property
    def promtool(self) -> Path:
        return self.home / "usr" / "bin" / "promtool"

    @property
    def assets(self) -> Path:
        return self.home / "usr" / "share" / "prometheus" / "web"

    def version(self) -> str:
        """The version `prometheus --version` prints, e.g. "2.42.0"; DevStackError when it does not run."""
        try:
            done = subprocess.run([str(self.server), "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevStackError(f"{self.server} --version failed: {exc}") from exc
        found = _VERSION_LINE.search(done.stdout + done.stderr)
        if done.returncode != 0 or found is None:
            raise DevStackError(f"{self.server} --version exited with {done.returncode}: {done.stderr[-1000:]}")
        return found.group(1)

    def promtool_run(self, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`promtool ARGS`, its output captured (never raises on its exit code)."""
        return subprocess.run([str(self.promtool), *map(str, args)], capture_output=True, text=True, timeout=120,
                              cwd=cwd)


def home() -> Path:
    return cache_dir() / f"prometheus-{VERSION}"


def installed() -> Prometheus:
    """Prometheus from the cache, fetched and checked first when missing."""
    target = home()
    if not maven.is_resolved(target):
        _install(target)
    return Prometheus(target)


def _install(target: Path) -> None:
    staging = target.parent / f"{target.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        try:
            deb = debian.download(PACKAGE, staging / "download")
        except DevStackError as exc:
            raise DevStackError(
                f"{exc}. Debian removes a package's superseded build from its pool: pin the current one in "
                "tests/prometheus_server.py (`apt-cache show prometheus` prints its Filename and SHA256)"
            ) from exc
        debian.unpack(deb, staging)
        shutil.rmtree(staging / "download")
        found = Prometheus(staging).version()
        if found != VERSION:
            raise DevStackError(f"{PACKAGE.filename} holds prometheus {found}, not {VERSION}")
        (staging / maven.COMPLETE).write_text(PACKAGE.filename)
    except (DevStackError, OSError):
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if maven.is_resolved(target):  # another process (a parallel test worker) finished first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
        return
    shutil.rmtree(target, ignore_errors=True)
    try:
        staging.rename(target)
    except OSError:  # another process renamed its copy in between
        shutil.rmtree(staging, ignore_errors=True)
        if not maven.is_resolved(target):
            raise


class PrometheusApiError(AssertionError):
    """Raised when the Prometheus HTTP API answers `status: error`; the message is its `error`."""


@dataclass
class PrometheusServer:
    """One Prometheus server on loopback, with its configuration, data and log in `base_dir`."""

    prometheus: Prometheus
    base_dir: Path
    port: int = 0
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, config: dict[str, Any]) -> None:
        """Start with `config` (prometheus.yml as a dict; relative rule files are found in `base_dir`)
        and wait until the server is ready."""
        self.port = self.port or free_port()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        config_file = self.base_dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        web = self.prometheus.home / "etc" / "prometheus"
        argv = [
            str(self.prometheus.server),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.base_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.local-assets={self.prometheus.assets}",
            f"--web.console.templates={web / 'consoles'}",
            f"--web.console.libraries={web / 'console_libraries'}",
            "--log.level=warn",
        ]
        self.process = ManagedProcess("prometheus", argv, self.base_dir / "prometheus.log")
        self.process.start()
        try:
            wait_until(f"Prometheus on port {self.port}", self._ready, _START_TIMEOUT_S, self.process)
        except DevStackError:
            self.stop()
            raise

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as answer:
            return bool(answer.status == 200)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def api(self, path: str, params: dict[str, str] | None = None) -> Any:
        """GET /api/v1/`path` with `params`: its `data`; PrometheusApiError with the server's
        `error` when it answers `status: error`."""
        query = urllib.parse.urlencode(params or {})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:  # 400 bad_data, 422 execution errors: the body says why
            body = json.loads(exc.read())
        if body.get("status") != "success":
            raise PrometheusApiError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now (PrometheusApiError on a parse or evaluation error)."""
        data = self.api("query", {"query": expr})
        return list(data["result"]) if data["resultType"] == "vector" else [data["result"]]

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process is not None else ""

"""A Spark standalone cluster (one master, one worker) started from the PySpark install.

The master and the worker are the Java classes `org.apache.spark.deploy.master.Master` and
`org.apache.spark.deploy.worker.Worker`, run with `java -cp <pyspark>/jars/*` as our own
processes (their real process ids; each in its own process group, which also holds the
executors the worker launches), bound to 127.0.0.1 on free ports, with their work and log
folders under a fresh temporary folder. `stop()` stops the worker then the master by pid
(SIGTERM, SIGKILL after a grace period) and kills what is left of the worker's process group
(an executor outliving its worker).

The worker's environment is deliberately not the test's: no `PYSPARK_*`, and a `PATH` whose
`python3` is `bare_python`, an interpreter without this package or pymongo (a fresh virtual
environment). So executors get an interpreter with the package only when the job names one,
as on a real cluster whose nodes have a system `python3`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.dev.processes import spawn
from relay.dev.stack import ManagedProcess, free_port
from tests.support.waiting import wait_until

# Room for two applications at once: the tests' own (tests/spark/sessions.py: one core, 512 MB)
# and a command's (the rest of the cores, spark.executor.memory's default 1g). What the worker
# offers is bookkeeping: an executor's heap grows as it needs, up to its -Xmx.
WORKER_CORES = 3
WORKER_MEMORY = "1536m"
DAEMON_HEAP = "-Xmx256m"
# Every JVM of the tests' Spark (daemons, executors, drivers) compiles with C1 only and collects
# with one thread: these JVMs live for seconds on tiny data, where C2's compile threads and
# parallel GC cost two shared cores more than they save.
JAVA_TOOL_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pyspark_home() -> Path:
    """The pip-installed PySpark folder: bin/, jars/, python/lib (a SPARK_HOME)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _scala_version() -> str:
    """The Scala binary version of the PySpark jars (from `spark-core_<version>-*.jar`)."""
    jar = next((pyspark_home() / "jars").glob("spark-core_*.jar"))
    return jar.name.removeprefix("spark-core_").split("-")[0]


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    assert java, "Java 17+ is needed for the Spark cluster"
    return java


def bare_interpreter(folder: Path) -> Path:
    """A Python interpreter with only the standard library (a virtual environment without pip)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder / "bin" / "python3"


@dataclass
class StandaloneCluster:
    """One master and one worker on 127.0.0.1; `master_url` is what jobs pass as `--master`."""

    base_dir: Path
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    worker_ui_port: int = field(default_factory=free_port)
    master: ManagedProcess | None = None
    worker: ManagedProcess | None = None
    bare_python: Path | None = None

    @classmethod
    def in_temp_dir(cls) -> StandaloneCluster:
        return cls(Path(tempfile.mkdtemp(prefix="outbox-relay-spark-cluster-")))

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def work_dir(self) -> Path:
        """Where the worker runs executors: `<work_dir>/<app id>/<executor id>/` is their cwd."""
        return self.base_dir / "work"

    def _env(self) -> dict[str, str]:
        assert self.bare_python is not None
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYSPARK_", "SPARK_", "RELAY_", "VIRTUAL_ENV", "PYTHON"))}
        env["PATH"] = os.pathsep.join([str(self.bare_python.parent), "/usr/bin", "/bin"])
        env["SPARK_HOME"] = str(pyspark_home())  # the worker builds executor command lines from it
        env["SPARK_SCALA_VERSION"] = _scala_version()  # as bin/load-spark-env.sh sets it
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["SPARK_LOG_DIR"] = str(self.base_dir / "logs")
        env["SPARK_WORKER_DIR"] = str(self.work_dir)
        env["SPARK_LOCAL_DIRS"] = str(self.base_dir / "local")
        env["JAVA_TOOL_OPTIONS"] = JAVA_TOOL_OPTIONS  # inherited by the executors the worker starts
        return env

    def _daemon(self, name: str, main_class: str, *args: str) -> ManagedProcess:
        argv = [_java(), DAEMON_HEAP, "-cp", str(pyspark_home() / "jars" / "*"), main_class, *args]
        process = ManagedProcess(name, argv, self.base_dir / f"{name}.log")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with open(process.log_path, "ab") as log:
            process.popen = spawn(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=self._env(), cwd=self.base_dir, start_new_session=True)
        process.pid = process.popen.pid
        return process

    def status(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=5) as answer:
            return json.loads(answer.read())

    def _alive_workers(self) -> int:
        for process in (self.master, self.worker):
            assert process is not None and process.alive, (
                f"spark {process.name if process else 'daemon'} exited:\n{process.log_tail() if process else ''}")
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def start(self) -> StandaloneCluster:
        """Start the master, then the worker; return once the master lists the worker as alive."""
        self.bare_python = bare_interpreter(self.base_dir / "bare-python")
        for folder in ("work", "logs", "local"):
            (self.base_dir / folder).mkdir(parents=True, exist_ok=True)
        try:
            self.master = self._daemon("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                       "--port", str(self.master_port), "--webui-port", str(self.master_ui_port))
            self.worker = self._daemon("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                       "--webui-port", str(self.worker_ui_port), "--cores", str(WORKER_CORES),
                                       "--memory", WORKER_MEMORY, "--work-dir", str(self.work_dir),
                                       self.master_url)
            wait_until(lambda: self._alive_workers() == 1, 120, "the Spark worker to register with the master",
                       interval=0.5)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the worker (it stops its executors), then the master, by pid; then SIGKILL any
        process left in the worker's group."""
        for process in (self.worker, self.master):
            if process is not None:
                process.stop(timeout=20)
        if self.worker is not None and self.worker.pid is not None:
            try:
                os.killpg(self.worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def executor_folders(self) -> list[Path]:
        """The executors' working folders (`<work>/<app id>/<executor id>`), one per executor run."""
        return sorted(p for p in self.work_dir.glob("app-*/*") if p.is_dir())

    def logs(self, chars: int = 4000) -> str:
        parts = [f"--- {p.name}\n{p.log_tail(chars)}" for p in (self.master, self.worker) if p is not None]
        for folder in self.executor_folders()[-2:]:
            stderr = folder / "stderr"
            if stderr.exists():
                parts.append(f"--- executor {folder}\n{stderr.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)


@dataclass
class Finished:
    """A command run to its end: exit code and everything it printed (stdout and stderr)."""

    returncode: int
    output: str

    @property
    def last_line(self) -> str:
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def run_to_end(argv: list[str], env: dict[str, str], cwd: Path, log_path: Path, timeout: float) -> Finished:
    """Run `argv` in its own process group (the Python driver, its JVM, its Python workers) until it
    exits; past `timeout`, SIGKILL the group by its id and fail with the end of the log."""
    with open(log_path, "wb") as log:
        proc = spawn(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            raise AssertionError(f"{argv[:4]} still running after {timeout:.0f} s; log:\n"
                                 f"{log_path.read_text(errors='replace')[-4000:]}") from None
        finally:
            try:  # whatever the command left in its group (a JVM outliving its driver)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return Finished(proc.returncode, log_path.read_text(errors="replace"))

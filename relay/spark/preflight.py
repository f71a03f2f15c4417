"""Checks a job runs before its queries: can the executors do their part?

A misconfigured cluster otherwise shows up late and badly: the MongoDB read model's writes fail
in the executors after the event table was written, with a page of Java and Python stack traces
(executors without this package), or the job "succeeds" writing its output where the driver
cannot see it (an output folder on each node's local disk). Each check runs one tiny Spark job
and raises a PipelineError with one line naming the cause and the fix.

- `check_executor_python`: an executor starts a Python worker and, for `materialize` (whose read
  model's `foreachPartition` runs this package's code there), imports this package and pymongo in
  it; `audit` runs only PySpark's own code in the executors (the outbox rows it hands to Spark), so
  for it the worker must start, nothing more. What the executors run is `PYSPARK_PYTHON` /
  `spark.pyspark.python` of the driver (default `python3`, resolved on each node).
- `check_shared_folder`: one executor writes a one-row text file into
  `<folder>/_storage-check-<random>/` through Spark's ordinary file writer; the driver then lists
  that folder. On storage every node sees (HDFS, S3, NFS, one machine's disk in local mode) the
  committed `part-` file is there; when the executors write to a disk the driver does not see
  (the same path on each node's local disk), the driver finds the folder without it. Either way
  the driver deletes the folder afterwards (what an executor wrote on its own disk stays there).
  The write commits through the same output committer as the job's files, so a `part-` file
  the driver can list after the commit is one the driver can read; a slow directory listing
  cannot make the check fail once the commit has returned on strongly consistent stores (HDFS,
  S3) or NFS (close-to-open consistency, a folder name never looked up before).
"""

from __future__ import annotations

import contextlib
import platform
import re
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from relay.spark import PipelineError
from relay.spark.state import HadoopFs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DOCS = "docs/spark.md"
# A Java or Python exception as "name: message": `java.io.IOException: Cannot run program ...`,
# `ModuleNotFoundError: No module named 'relay'`.
_EXCEPTION = r"((?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)): ([^\n]+)"
# Spark's report of a failed task ("Job aborted due to stage failure: ... most recent failure: Lost
# task 0.3 in stage 0.0 (TID 3) (host executor 0): <the task's exception>"), mid-line after Py4J's ": ".
_TASK_FAILURE = re.compile(r"most recent failure: Lost task [^\n]*?\): " + _EXCEPTION)
_LINE_START = re.compile(r"^" + _EXCEPTION, re.MULTILINE)  # Python's traceback ends with one
_PY4J_JAVA = re.compile(r"^(?:: |Caused by: )" + _EXCEPTION, re.MULTILINE)  # Py4J's Java exception, its causes
_SPARK_ERROR = re.compile(r"\[([A-Z_]+)\] ([^\n]+)")
_PYTHON_TASK = "org.apache.spark.api.python.PythonException"  # its message is the worker's Python traceback
_TASK_FAILURE_LOGGERS = (
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.scheduler.TaskSchedulerImpl",
    "org.apache.spark.executor.Executor",
)


def _imports(rows: Iterable[Any]) -> Iterator[str]:
    """Runs in an executor's Python worker. Unpickling it imports this module, i.e. `relay`."""
    import pymongo  # noqa: F401 - the read model's client

    import relay.spark.state  # noqa: F401 - the read model's writer

    for _ in rows:
        pass
    yield f"{sys.executable} (Python {platform.python_version()})"


def _worker_starts() -> Callable[[Iterable[Any]], Iterator[str]]:
    """A probe for an executor's Python worker that imports nothing of this package there: a
    function defined inside another cannot be imported by name, so cloudpickle sends its code."""

    def runs(rows: Iterable[Any]) -> Iterator[str]:
        import platform
        import sys

        for _ in rows:
            pass
        yield f"{sys.executable} (Python {platform.python_version()})"

    return runs


def python_error(text: str) -> str:
    """The root cause of a failed Spark job as one line, out of the Py4J error that wraps it
    ("An error occurred while calling ...collectAndServe" says only which call failed), the first
    of:
    - a Python import failure (`ModuleNotFoundError: No module named 'relay'`);
    - a PySpark error class about Python (`[PYTHON_VERSION_MISMATCH] ...`);
    - the exception of the failed task, as Spark reports it after "Lost task ... (executor N): "
      (`java.io.IOException: Cannot run program ".../python": error=2, No such file or directory`
      when the executors cannot start the interpreter), unless it is a PythonException, whose
      message is the Python worker's traceback;
    - the last `...Error: message` / `...Exception: message` line (a Python traceback's end);
    - the last Java exception Py4J reports after ": " or "Caused by: " (the deepest cause);
    - the first line."""
    if (found := re.search(r"ModuleNotFoundError: [^\n]+", text)) is not None:
        return found.group(0)
    if (error := _SPARK_ERROR.search(text)) is not None and "PYTHON" in error.group(1):
        return f"[{error.group(1)}] {error.group(2)}"
    if (task := _TASK_FAILURE.search(text)) is not None and task.group(1) != _PYTHON_TASK:
        return f"{task.group(1)}: {task.group(2)}"
    for pattern in (_LINE_START, _PY4J_JAVA):
        found_all = [m for m in pattern.finditer(text) if not m.group(1).rsplit(".", 1)[-1].startswith("Py4J")]
        if found_all:
            return f"{found_all[-1].group(1)}: {found_all[-1].group(2)}"
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


def executor_python(spark: SparkSession) -> str:
    """The interpreter the executors are told to run (`PYSPARK_PYTHON` of the driver, else
    `spark.pyspark.python`, else `python3`), as the driver's SparkContext holds it."""
    return str(getattr(spark.sparkContext, "pythonExec", None) or "python3")


@contextlib.contextmanager
def _quiet_task_failures(spark: SparkSession) -> Iterator[None]:
    """Spark's own report of each failed attempt (a Python traceback per attempt) off while a
    probe runs: the probe's error says what failed."""
    jvm: Any = spark.sparkContext._jvm
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    manager = jvm.org.apache.logging.log4j.LogManager
    before = {name: manager.getLogger(name).getLevel() for name in _TASK_FAILURE_LOGGERS}
    for name in before:
        configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.OFF)
    try:
        yield
    finally:
        for name, level in before.items():
            configurator.setLevel(name, level)


def check_executor_python(spark: SparkSession, package: bool = True) -> str:
    """Raise PipelineError, one line, unless an executor starts a Python worker that (with
    `package`, for `materialize`'s read model) imports this package and pymongo; returns what the
    executor ran (interpreter path and Python version)."""
    probe = _imports if package else _worker_starts()
    try:
        with _quiet_task_failures(spark):
            ran = spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
    except Exception as exc:
        needs = "this package's Python code" if package else "Python"
        installed = " with outbox-relay and pymongo installed" if package else ""
        raise PipelineError(
            f"the Spark executors cannot run {needs} ({python_error(str(exc))}; executors run "
            f"{executor_python(spark)!r}): set PYSPARK_PYTHON (or spark.pyspark.python) to an interpreter"
            f"{installed} at the same path on every node, or ship an environment with --archives; see {DOCS}"
        ) from exc
    return ran[0]


def check_shared_folder(spark: SparkSession, folder: str, flag: str) -> None:
    """Raise PipelineError, one line, when a file an executor writes under `folder` is not
    visible to the driver (`flag` names the option that chose the folder)."""
    probe = f"{folder.rstrip('/')}/_storage-check-{uuid.uuid4().hex}"
    fs = HadoopFs(spark, probe)
    try:
        with _quiet_task_failures(spark):
            spark.range(1, numPartitions=1).selectExpr("'storage check' AS value").write.text(probe)
        seen = [name for name in fs.children(directories_only=False) if name.startswith("part-")]
    except Exception as exc:
        raise PipelineError(f"{flag} {folder}: the executors cannot write there ({python_error(str(exc))})") from exc
    finally:
        with contextlib.suppress(Exception):  # best effort; the finding matters more
            fs.delete()
    if not seen:
        raise PipelineError(
            f"{flag} {folder} is not shared by the driver and the executors: a file an executor wrote "
            f"there is not visible to the driver (each node has its own {folder}); use storage every "
            f"node sees, such as HDFS, S3 or NFS; see {DOCS}"
        )


def is_local_master(spark: SparkSession) -> bool:
    """Driver and executors are one process (`local`, `local[N]`, `local[*]`)."""
    return str(spark.sparkContext.master).startswith("local")

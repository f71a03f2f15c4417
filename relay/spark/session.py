"""The SparkSession the jobs run in.

Two ways to start, one set of job settings:

- Run directly (`outbox-relay pipeline ...`, `python relay/spark/materialize.py`), this process
  launches the driver JVM itself: the connector jars as `spark.jars` (local paths from
  `relay.spark.jars`), `local[*]` unless a master is given, the driver's scratch space
  (`spark.local.dir`, its `java.io.tmpdir`, the warehouse) in a fresh temporary folder removed at
  exit, and the JVM's working directory in that folder too (Spark 4.0.0 creates an `artifacts/`
  folder in the driver's working directory, SPARK-52396, and leaves it behind). The executors'
  Python is this interpreter (`PYSPARK_PYTHON` defaults to `sys.executable`): on a cluster that
  path must exist on every node, with this package and pymongo installed.
- Under `spark-submit` (the JVM is already up), master, jars and interpreter come from
  spark-submit (`--jars $(python -m relay.spark.jars --classpath)`, `PYSPARK_PYTHON` or
  `spark.pyspark.python`).

In both, the job settings are applied to the session: `spark.sql.shuffle.partitions` (the number
of state partitions a new streaming checkpoint records for good), session time zone UTC (event
dates are UTC dates), the RocksDB state store (the de-duplication state holds every event id;
RocksDB keeps it off the JVM heap), console progress bars off, Spark's log level WARN (also for
the lines of the context's start under spark-submit), and Spark's own redaction widened to the
relay's credential names (`REDACTION`); `conf` entries win.

Credentials and Spark: the Kafka options (`--kafka-option`, e.g. `sasl.jaas.config`) reach
Spark only as options of the Kafka source, never its configuration; Spark masks them in the
plans it prints (`spark.sql.redaction.options.regex`) and Kafka's Java client prints its
password-typed properties as `[hidden]`. `--spark-conf` entries are Spark configuration: a
driver this process launches gets them as `--conf` arguments on its command line (PySpark's
launch), and Spark masks those whose name or value matches `spark.redaction.regex` in its UI,
event log and environment dumps. docs/security.md says what remains.

The executors' own temporary folders are the cluster manager's business (standalone workers
set `SPARK_LOCAL_DIRS`); nothing of the driver's file system is passed to them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

from relay.spark.jars import spark_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from relay.config import Settings

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# Settings every job relies on, applied to the session however it was started.
JOB_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "WARN",  # Spark's own log lines: warnings and errors (from the start on)
}
# Spark's own redaction (its UI, event log, `explain` output, environment dumps), widened from its
# defaults (`(?i)secret|password|token|access[.]?key` and `(?i)url`) to the names relay.core.redact
# treats as credentials, and to the user info of any URI in a plan.
REDACTION: dict[str, str] = {
    "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|jaas|sasl[._]|basic[._]?auth|credential",
    "spark.sql.redaction.options.regex": r"(?i)url|uri|jaas|sasl[._]|password|secret|token|basic[._]?auth",
    "spark.sql.redaction.string.regex": r"(?<=://)[^/?#\s\"']*(?=@)",
}
JOB_CONF.update(REDACTION)


def under_spark_submit() -> bool:
    """True when this Python process was started by spark-submit (its JVM is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _scratch_dir() -> str:
    path = tempfile.mkdtemp(prefix="outbox-relay-spark-")
    atexit.register(shutil.rmtree, path, True)
    return path


def job_conf(shuffle_partitions: int, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings a job applies to its session in every mode (`conf` entries win)."""
    return {**JOB_CONF, "spark.sql.shuffle.partitions": str(shuffle_partitions), **(conf or {})}


def launch_conf(master: str | None, scratch: str) -> dict[str, str]:
    """Settings for a driver JVM this process launches itself (not under spark-submit)."""
    jars = ",".join(str(j) for j in spark_jars())
    return {
        "spark.master": master or "local[*]",
        "spark.jars": jars,
        "spark.local.dir": scratch,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
        "spark.sql.warehouse.dir": os.path.join(scratch, "warehouse"),
    }


def active_session() -> SparkSession | None:
    """The session this process already has, if any (jobs then leave it running when done)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


_launched: list[object] = []  # the driver JVM this process launched (at most one)


def _launch_driver(app_name: str, settings: Mapping[str, str], scratch: str) -> None:
    """Start the driver JVM with its working directory in `scratch`, and its SparkContext. A JVM
    this process launched earlier is reused as it is (SparkContext reuses its gateway)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=False).setAppName(app_name).setAll(list(settings.items()))
    gateway = None
    if not _launched:
        gateway = launch_gateway(conf, popen_kwargs={"cwd": scratch})
        _launched.append(gateway)
    SparkContext(conf=conf, gateway=gateway)


def spark_session(
    app_name: str, master: str | None = None, shuffle_partitions: int = 8, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The session for a job: an existing one if this process has it, else a new one.

    `shuffle_partitions` is the number of state partitions of a new streaming checkpoint; a
    restarted query keeps the number its checkpoint was created with. `conf` entries win.
    With an existing session, the job settings are applied to it.
    """
    from pyspark.sql import SparkSession

    settings = job_conf(shuffle_partitions, conf)
    if not under_spark_submit() and SparkSession.getActiveSession() is None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import relay, pymongo
        scratch = _scratch_dir()
        _launch_driver(app_name, {**launch_conf(master, scratch), **settings}, scratch)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(settings["spark.log.level"])
    return session


def setup_job_logging(settings: Settings) -> None:
    """The relay's log set-up for a job (`RELAY_LOG_LEVEL`, `RELAY_LOG_FORMAT`); relay.ops.logs leaves
    out py4j's INFO lines (one per gateway connection opened or closed)."""
    from relay.ops.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format)

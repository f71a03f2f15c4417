"""The SparkSession the jobs run in.

Run directly (`outbox-relay pipeline ...`, `python relay/spark/materialize.py`), the session
gets the connector jars as `spark.jars` (local paths from `relay.spark.jars`), `local[*]` unless
a master is given, Spark's scratch space (`spark.local.dir`, `java.io.tmpdir`, the warehouse) in
a fresh temporary folder removed at exit, and the Python workers run this interpreter.
Under `spark-submit` (the JVM is already up) master and jars come from spark-submit
(`--jars $(python -m relay.spark.jars --classpath)`); only SQL settings are applied.

Always: session time zone UTC (event dates are UTC dates), the RocksDB state store (the
de-duplication state holds every event id; RocksDB keeps it off the JVM heap), console progress
bars off.
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

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# SQL settings every job relies on, applied even when the session already exists.
SQL_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def under_spark_submit() -> bool:
    """True when this Python process was started by spark-submit (its JVM is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _scratch_dir() -> str:
    path = tempfile.mkdtemp(prefix="outbox-relay-spark-")
    atexit.register(shutil.rmtree, path, True)
    return path


def launch_conf(master: str | None, shuffle_partitions: int, scratch: str) -> dict[str, str]:
    """Settings for a JVM this process launches itself (not under spark-submit)."""
    jars = ",".join(str(j) for j in spark_jars())
    return {
        "spark.master": master or "local[*]",
        "spark.jars": jars,
        "spark.local.dir": scratch,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
        "spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
        "spark.sql.warehouse.dir": os.path.join(scratch, "warehouse"),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.showConsoleProgress": "false",
    }


def active_session() -> SparkSession | None:
    """The session this process already has, if any (jobs then leave it running when done)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def spark_session(app_name: str, master: str | None = None, shuffle_partitions: int = 8,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """The session for a job: an existing one if this process has it, else a new one.

    `shuffle_partitions` is the number of state partitions of a new streaming checkpoint; a
    restarted query keeps the number its checkpoint was created with. `conf` entries win.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if not under_spark_submit() and SparkSession.getActiveSession() is None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import relay, pymongo
        for key, value in launch_conf(master, shuffle_partitions, _scratch_dir()).items():
            builder = builder.config(key, value)
    for key, value in {**SQL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

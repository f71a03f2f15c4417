"""The cluster checks' pure parts (the root cause out of a Java error, paths, the job settings),
and the storage check on a real shared folder (the session's local Spark: no false alarm).
The failures themselves run on a standalone cluster in test_cluster.py."""

from __future__ import annotations

import os

from relay.spark.materialize import _parser, absolute, config_from_args
from relay.spark.preflight import check_shared_folder, python_error
from relay.spark.session import job_conf

# The shape of what py4j raises when a task's Python worker cannot unpickle the function.
PY4J_IMPORT_FAILURE = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent \
failure: Lost task 0.3 in stage 0.0 (TID 3) (127.0.0.1 executor 0): org.apache.spark.api.python.PythonException: \
Traceback (most recent call last):
  File "/x/pyspark.zip/pyspark/worker.py", line 2024, in main
    func, profiler, deserializer, serializer = read_command(pickleSer, infile)
  File "/x/pyspark.zip/pyspark/serializers.py", line 473, in loads
    return cloudpickle.loads(obj, encoding=encoding)
ModuleNotFoundError: No module named 'relay'

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:621)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:939)
"""

VERSION_MISMATCH = """: org.apache.spark.SparkException: Job aborted due to stage failure: ... \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/pyspark.zip/pyspark/worker.py", line 1925, in main
pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has different \
version: 3.9 than that in driver: 3.11, PySpark cannot run with different minor versions.
"""


# What py4j raises on a standalone cluster whose executors lack the interpreter the driver names
# (the first lines, then the shape of the rest: Spark's driver stack trace and the causes).
NO_INTERPRETER = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent \
failure: Lost task 0.3 in stage 0.0 (TID 3) (127.0.0.1 executor 0): java.io.IOException: Cannot run program \
"/opt/venv/bin/python": error=2, No such file or directory
\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)
\tat org.apache.spark.api.python.PythonWorkerFactory.startDaemon(PythonWorkerFactory.scala:287)
Caused by: java.io.IOException: error=2, No such file or directory
\tat java.base/java.lang.ProcessImpl.forkAndExec(Native Method)

Driver stacktrace:
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2935)
Caused by: java.io.IOException: Cannot run program "/opt/venv/bin/python": error=2, No such file or directory
\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)
Caused by: java.io.IOException: error=2, No such file or directory
"""
DRIVER_SIDE = """An error occurred while calling o91.text.
: java.io.IOException: Mkdirs failed to create file:/data/outbox/_storage-check-1
\tat org.apache.hadoop.fs.ChecksumFileSystem.create(ChecksumFileSystem.java:715)
"""


def test_the_root_cause_of_a_failed_python_task_is_one_line():
    assert python_error(PY4J_IMPORT_FAILURE) == "ModuleNotFoundError: No module named 'relay'"
    assert python_error(VERSION_MISMATCH) == (
        "[PYTHON_VERSION_MISMATCH] Python in worker has different version: 3.9 than that in driver: 3.11, "
        "PySpark cannot run with different minor versions.")
    assert python_error("java.io.IOException: Mkdirs failed\n\tat x") == "java.io.IOException: Mkdirs failed"


def test_the_root_cause_of_a_failed_java_task_or_call_is_the_exception_after_py4js_prefix():
    """Py4J writes the Java exception after ": " (and its causes after "Caused by: "), Spark the
    failed task's exception after "Lost task ... (executor N): ", not at a line's start."""
    assert python_error(NO_INTERPRETER) == (
        'java.io.IOException: Cannot run program "/opt/venv/bin/python": error=2, No such file or directory')
    assert python_error(DRIVER_SIDE) == "java.io.IOException: Mkdirs failed to create file:/data/outbox/_storage-check-1"


def test_relative_local_paths_become_absolute_and_uris_stay_as_they_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute("out") == str(tmp_path / "out")
    for kept in ("/data/outbox", "s3a://bucket/outbox", "hdfs://nn:8020/outbox", "file:///data/outbox"):
        assert absolute(kept) == kept
    cfg, _, _ = config_from_args(_parser().parse_args(["--output", "lake", "--checkpoint", "ckpt"]))
    assert (cfg.output, cfg.checkpoint) == (str(tmp_path / "lake"), str(tmp_path / "ckpt"))
    cfg, _, _ = config_from_args(_parser().parse_args(["--output", "lake"]))
    assert cfg.checkpoint == os.path.join(tmp_path, "lake", "_checkpoints")


def test_the_job_settings_carry_the_shuffle_partitions_and_user_settings_win():
    conf = job_conf(3)
    assert conf["spark.sql.shuffle.partitions"] == "3" and conf["spark.sql.session.timeZone"] == "UTC"
    assert job_conf(3, {"spark.sql.shuffle.partitions": "5"})["spark.sql.shuffle.partitions"] == "5"


def test_a_shared_folder_passes_the_storage_check_and_keeps_no_probe(spark, tmp_path):
    check_shared_folder(spark, str(tmp_path / "out"), "--output")
    assert list((tmp_path / "out").iterdir()) == []


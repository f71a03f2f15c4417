"""The pipeline on a Spark standalone cluster (one master, one worker started from the PySpark
install, tests/spark/cluster.py), both ways the README runs it, and the failures a cluster adds.

- `outbox-relay pipeline materialize --once` and `audit` with `--master spark://...`: the views
  equal the state computed from the outbox; the audit finds exactly the planted missing event.
- The README's `spark-submit` block, run by bash exactly as written: the same comparison, and the
  checkpoint records the session's shuffle partitions.
- Executors whose Python lacks the package, executors that cannot start the interpreter at all
  (both jobs), and an output folder the executors write on a disk the driver does not see
  (`--once`; the check precedes the mode): one line each, before anything is read.

One small data set per test. `materialize` on the command line and `spark-submit` are driver
processes of their own (Spark applications, as a user runs them); `audit` and the failures run
the same command line (`relay.cli.main`) in this process, in one application on the cluster that
the module keeps (`cluster_spark`: its executor is a real one on the worker, told the interpreter
the test names), which also reads what the commands wrote.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.cli import main as cli
from relay.core.errors import EXIT_DATA, EXIT_FATAL
from relay.outbox import Outbox, OutboxEvent
from relay.spark.materialize import DEFAULT_VIEW_COLLECTION
from tests.spark.cluster import JAVA_TOOL_OPTIONS, Finished, StandaloneCluster, run_to_end
from tests.spark.sessions import cluster_session, stop
from tests.spark.support import (
    VIEW_COLLECTION,
    assert_view_equals_outbox,
    mongo_view,
    outbox_state,
    parquet_view,
    pipeline_command,
    positions,
)
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events

EVENTS = 300
JOB_TIMEOUT_S = 420  # a generous bound for one job on a busy machine; a hung job fails the test
CLI_FLAGS = ["--shuffle-partitions", "2", "--spark-conf", "spark.ui.enabled=false",
             "--view-collection", VIEW_COLLECTION]
SPARK_SUBMIT_MARKER = "<!-- spark-submit: run as written by tests/spark/test_cluster.py -->"


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandaloneCluster]:
    standalone = StandaloneCluster.in_temp_dir().start()
    try:
        yield standalone
    finally:
        standalone.stop()
        shutil.rmtree(standalone.base_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_spark(cluster: StandaloneCluster) -> Iterator[Any]:
    """The module's application on the cluster (tests/spark/sessions.py: one core, so the commands'
    applications get executors beside it)."""
    session = cluster_session(cluster.master_url)
    try:
        yield session
    finally:
        stop()


def _publish(env, total: int = EVENTS) -> Written:
    with RelayThread(env.settings):
        written = write_events(env.db, env.settings.outbox_collection, total=total, writers=2)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= total, 90, f"{total} events")
    return written


def _job_env(env, tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell: the test's settings as RELAY_*, no PySpark variables;
    temporary files under `tmp` (a job killed on a timeout skips its own clean-up). PYTHONPATH
    names this checkout, as running from its folder does: the drivers run the code under test
    also when the environment's editable install is another checkout (a git worktree)."""
    base = {k: v for k, v in settings_env(env.settings).items()
            if not k.startswith(("PYSPARK_", "SPARK_")) and k != "VIRTUAL_ENV"}
    tmp.mkdir(exist_ok=True)
    return base | {"JAVA_TOOL_OPTIONS": JAVA_TOOL_OPTIONS, "TMPDIR": str(tmp)} | extra


def _cli(env, cluster: StandaloneCluster, tmp_path: Path, name: str, job: str, *args: str,
         **extra_env: str) -> Finished:
    cwd = tmp_path / f"{name}-cwd"
    cwd.mkdir()
    return run_to_end(pipeline_command(job, "--master", cluster.master_url, *args),
                      _job_env(env, tmp_path / f"{name}-tmp", **extra_env),
                      cwd, tmp_path / f"{name}.log", JOB_TIMEOUT_S)


def _in_process(env, monkeypatch, capsys, job: str, *args: str) -> Finished:
    """`outbox-relay pipeline <job> ...` run by the CLI's `main` in this process, where it finds the
    module's cluster application running and uses it: its exit code and everything it printed."""
    for key, value in settings_env(env.settings).items():
        if key.startswith("RELAY_"):
            monkeypatch.setenv(key, value)
    code = cli(["pipeline", job, *args])
    printed = capsys.readouterr()
    return Finished(code, printed.out + printed.err)


def _assert_views_equal_the_outbox(env, spark, output: Path, written: Written,
                                   collection: str = VIEW_COLLECTION) -> None:
    ids = [r["id"] for r in spark.read.parquet(str(output / "events")).select("id").collect()]
    assert len(ids) == len(set(ids)) == len(written.ids) and set(ids) == written.ids, "each event exactly once"
    expected = outbox_state(env.outbox, [("order", written)])
    position_of = positions(read_topic(env.servers.kafka_bootstrap, env.topic()))
    assert_view_equals_outbox(parquet_view(spark, str(output / "state")), expected, position_of)
    assert_view_equals_outbox(mongo_view(env.db, collection), expected, position_of)


def test_command_line_materialize_and_audit_on_a_standalone_cluster(env, cluster_spark, cluster, tmp_path,
                                                                     monkeypatch, capsys):
    """`materialize` as a user runs it, a driver process of its own; then `audit` through the same
    command line in this process, on the module's application (the driver launch it would repeat
    is the same code, relay.spark.session, checked here with materialize's)."""
    written = _publish(env)
    missing = OutboxEvent.new("order", "planted-missing", "Created", {"n": 1})
    Outbox(env.outbox).add(missing)  # committed while no relay runs: never published
    output = tmp_path / "out"

    run = _cli(env, cluster, tmp_path, "materialize", "materialize", "--output", str(output), "--once",
               *CLI_FLAGS, RELAY_LOG_FORMAT="text")
    assert run.returncode == 0, f"{run.output[-4000:]}\n{cluster.logs()}"
    _assert_views_equal_the_outbox(env, cluster_spark, output, written)
    # RELAY_LOG_FORMAT is followed, py4j's INFO lines are not logged, nothing left in the cwd.
    assert re.search(r"^\S+ \S+ INFO relay\.spark\.materialize outbox-events: 300 rows", run.output, re.M), run.output
    assert '"level"' not in run.output and "py4j" not in run.output, run.output[-4000:]
    assert list((tmp_path / "materialize-cwd").iterdir()) == []
    # The executors got no java.io.tmpdir of the driver's (the worker logs each executor's command).
    commands = [line for folder in cluster.executor_folders() if (folder / "stderr").exists()
                for line in (folder / "stderr").read_text(errors="replace").splitlines()
                if line.startswith("Spark Executor Command:")]
    assert commands and not any("java.io.tmpdir" in c for c in commands), commands

    report_path = tmp_path / "report.json"
    audit = _in_process(env, monkeypatch, capsys, "audit", "--master", cluster.master_url, "--json", str(report_path),
                        *CLI_FLAGS[:4])
    assert audit.returncode == EXIT_DATA, f"{audit.output[-4000:]}\n{cluster.logs()}"
    report = json.loads(report_path.read_text())
    assert report["failures"] == ["missing"], report["failures"]
    assert [m["id"] for m in report["missing"]["sample"]] == [missing.id_str]
    assert report["outbox"]["events"] == len(written.ids) + 1
    assert report["kafka"]["eventsInRange"] == len(written.ids)


def readme_spark_submit() -> str:
    """The README's spark-submit block (the one after the marker), checked to be the same in
    docs/spark.md."""
    blocks = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "spark.md"):
        after = doc.read_text().split(SPARK_SUBMIT_MARKER, 1)
        assert len(after) == 2, f"{doc.name} has no {SPARK_SUBMIT_MARKER}"
        match = re.match(r"\s*```sh\n(.*?)```", after[1], re.S)
        assert match is not None, f"{doc.name}: the marker is followed by a ```sh block"
        blocks.append(match.group(1))
    assert blocks[0] == blocks[1], "README.md and docs/spark.md show different spark-submit lines"
    return blocks[0]


def _checkpoint_shuffle_partitions(output: Path) -> str:
    """`spark.sql.shuffle.partitions` as the events query's first offsets entry recorded it."""
    metadata = (output / "_checkpoints" / "outbox-events" / "offsets" / "0").read_text().splitlines()[1]
    return json.loads(metadata)["conf"]["spark.sql.shuffle.partitions"]


def test_spark_submit_as_the_readme_writes_it(env, cluster_spark, cluster, tmp_path):
    written = _publish(env)
    output = tmp_path / "out"
    script = readme_spark_submit()
    venv_bin = str(Path(sys.executable).parent)  # a shell where the environment is not activated
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    shell_env = _job_env(env, tmp_path / "submit-tmp", SPARK_MASTER=cluster.master_url, OUTPUT=str(output),
                         PATH=path)
    artifacts = ROOT / "artifacts"
    left_before = artifacts.exists()
    try:
        run = run_to_end(["bash", "-euo", "pipefail", "-c", script], shell_env, ROOT, tmp_path / "submit.log",
                         JOB_TIMEOUT_S)
    finally:
        if not left_before and artifacts.is_dir() and not any(artifacts.iterdir()):
            artifacts.rmdir()  # Spark 4.0.0 leaves it in spark-submit's working directory (SPARK-52396)
    assert run.returncode == 0, f"{run.output[-4000:]}\n{cluster.logs()}"
    _assert_views_equal_the_outbox(env, cluster_spark, output, written, DEFAULT_VIEW_COLLECTION)
    # --shuffle-partitions (default 8) reached the session under spark-submit, not Spark's 200.
    assert _checkpoint_shuffle_partitions(output) == "8"
    assert sorted(p.name for p in (output / "_checkpoints" / "outbox-events" / "state" / "0").iterdir()
                  if p.name.isdigit()) == [str(i) for i in range(8)]


def test_executors_without_the_package_stop_the_job_before_it_starts_with_one_line(
        env, cluster_spark, cluster, tmp_path, monkeypatch, capsys):
    """The executors are told to run an interpreter without outbox-relay (PYSPARK_PYTHON, which
    SparkContext holds as `pythonExec`): they cannot import it. Events are waiting, so without the
    check the job would write the event table, then fail in the MongoDB view's writes with a page
    of Java and Python traces."""
    _publish(env, 40)
    output = tmp_path / "out"
    monkeypatch.setattr(cluster_spark.sparkContext, "pythonExec", str(cluster.bare_python))
    run = _in_process(env, monkeypatch, capsys, "materialize", "--master", cluster.master_url, "--output", str(output),
                      "--once", *CLI_FLAGS)
    assert run.returncode == EXIT_FATAL, run.output[-4000:]
    assert run.last_line == (
        "outbox-relay pipeline: PipelineError: the Spark executors cannot run this package's Python code "
        f"(ModuleNotFoundError: No module named 'relay'; executors run '{cluster.bare_python}'): set "
        "PYSPARK_PYTHON (or spark.pyspark.python) to an interpreter with outbox-relay and pymongo installed at "
        "the same path on every node, or ship an environment with --archives; see docs/spark.md"), run.output[-4000:]
    assert "Traceback" not in run.output, run.output[-4000:]
    assert not (output / "events").exists() and not (output / "_checkpoints").exists(), "no query started"


def test_executors_that_cannot_start_their_interpreter_stop_both_jobs_with_the_cause_in_one_line(
        env, cluster_spark, cluster, tmp_path, monkeypatch, capsys):
    """The executors are told to run an interpreter path that does not exist on their node (the
    driver's `sys.executable`, on a node without it). Both jobs stop before reading anything with
    one line naming what the JVM reports (not the Py4J call that failed) and the path; `audit`
    needs only a Python that starts, `materialize` one with the package."""
    _publish(env, 40)
    missing = str(tmp_path / "venv" / "bin" / "python")
    monkeypatch.setattr(cluster_spark.sparkContext, "pythonExec", missing)
    cause = f'java.io.IOException: Cannot run program "{missing}": error=2, No such file or directory'
    output, report = tmp_path / "out", tmp_path / "report.json"
    for job, args, what, installed in (
            ("materialize", ["--output", str(output), "--once", *CLI_FLAGS], "this package's Python code",
             " with outbox-relay and pymongo installed"),
            ("audit", ["--json", str(report), *CLI_FLAGS[:4]], "Python", "")):
        run = _in_process(env, monkeypatch, capsys, job, "--master", cluster.master_url, *args)
        assert run.returncode == EXIT_FATAL, run.output[-4000:]
        assert run.last_line == (
            f"outbox-relay pipeline: PipelineError: the Spark executors cannot run {what} ({cause}; executors run "
            f"'{missing}'): set PYSPARK_PYTHON (or spark.pyspark.python) to an interpreter{installed} at the same "
            "path on every node, or ship an environment with --archives; see docs/spark.md"), run.output[-4000:]
        assert "Traceback" not in run.output, run.output[-4000:]
    assert not output.exists() and not report.exists(), "neither job read anything"


def test_output_the_driver_cannot_see_stops_the_job_with_one_line(env, cluster_spark, cluster, tmp_path, monkeypatch,
                                                                  capsys):
    """`/proc/self/cwd/out` is a different folder for each process that opens it: the driver JVM's
    working folder (a scratch folder relay.spark.session gives the JVM it launches) and the
    executor's (under the worker's work folder), as two machines' local disks mounted at one
    path. Events are waiting, so without the check `--once` would write the event table on the
    executor's disk and exit 0 (and the streaming mode would wait forever: the check runs before
    `materialize` branches on the mode, so `--once` alone is run here)."""
    mode = ["--once"]
    _publish(env, 40)
    run = _in_process(env, monkeypatch, capsys, "materialize", "--master", cluster.master_url, "--output",
                      "/proc/self/cwd/out", *mode, *CLI_FLAGS)
    assert run.returncode == EXIT_FATAL, run.output[-4000:]
    assert run.last_line == (
        "outbox-relay pipeline: PipelineError: --output /proc/self/cwd/out is not shared by the driver and the "
        "executors: a file an executor wrote there is not visible to the driver (each node has its own "
        "/proc/self/cwd/out); use storage every node sees, such as HDFS, S3 or NFS; see docs/spark.md"), \
        run.output[-4000:]
    # The probe's file is on the executor's side of the path (where its task commit left it: the job
    # commit, on the driver, saw none), and no query wrote anything there.
    executor_sides = [folder / "out" for folder in (cluster.work_dir / cluster_spark.sparkContext.applicationId).iterdir()
                      if (folder / "out").is_dir()]
    assert executor_sides and any(any(side.glob("_storage-check-*/**/part-*")) for side in executor_sides)
    assert not any((side / "events").exists() for side in executor_sides), "no query started"

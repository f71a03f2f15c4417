"""Resolving the Spark connector jars (set-up, not run time): `python -m relay.dev.spark_jars`.

Resolved once with Maven from Maven Central (`files/spark-pom.xml`, `mvn
dependency:copy-dependencies`) into the folder relay.spark.jars reads; later runs use the cached
folder and need no network. Artifacts PySpark already ships in its `jars/` folder (Scala, Hadoop
client, slf4j, compression codecs ...) are excluded, so the classpath holds one copy of each
library. `--classpath` prints the comma-separated list for `spark-submit --jars`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from importlib import resources
from pathlib import Path

from relay.dev import maven
from relay.spark import PipelineError
from relay.spark.jars import jars_dir, spark_version
from relay.spark.jars import main as jars_main

SCALA_BINARY_VERSION = "2.13"
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def _pyspark_jars_folder() -> Path | None:
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "jars"
    return folder if folder.is_dir() else None


def shipped_artifacts() -> set[str]:
    """Artifact ids of the jars Spark already has on its classpath (from their file names)."""
    folder = _pyspark_jars_folder()
    if folder is None:
        return set()
    return {m["artifact"] for p in folder.glob("*.jar") if (m := _JAR_NAME.match(p.name))}


def _resolve(version: str, target: Path) -> None:
    pom = resources.files("relay.dev.files") / "spark-pom.xml"
    try:
        maven.copy_dependencies(
            pom,
            target,
            {"spark.version": version, "scala.binary.version": SCALA_BINARY_VERSION},
            exclude=shipped_artifacts(),
        )
    except maven.MavenError as exc:
        raise PipelineError(
            f"Maven could not resolve the Spark {version} connectors "
            f"(spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}, spark-avro_{SCALA_BINARY_VERSION}):\n{exc}"
        ) from exc


def resolve_spark_jars() -> list[Path]:
    """The connector jars for the installed PySpark, resolved with Maven unless already cached."""
    version = spark_version()
    target = jars_dir(version)
    if not maven.is_resolved(target):
        _resolve(version, target)
    return sorted(target.glob("*.jar"))


def main() -> int:
    """`python -m relay.dev.spark_jars`: resolve the jars (set-up), then print where they are."""
    try:
        resolve_spark_jars()
    except PipelineError as exc:
        print(f"relay.dev.spark_jars: {exc}", file=sys.stderr)
        return exc.exit_code
    return jars_main([])


if __name__ == "__main__":
    sys.exit(main())

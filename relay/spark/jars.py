"""The Spark connector jars (Kafka source, Avro functions) for the installed PySpark version.

Resolved once with Maven from Maven Central (`spark-pom.xml`, `mvn dependency:copy-dependencies`)
into `~/.cache/outbox-relay/spark-jars-<pyspark version>/`; later runs use the cached folder and
need no network. Artifacts PySpark already ships in its `jars/` folder (Scala, Hadoop client,
slf4j, compression codecs ...) are excluded, so the classpath holds one copy of each library.
The jobs pass the result to Spark as `spark.jars` (local paths): nothing is resolved at run time
(no `spark.jars.packages`, no Ivy).

Run `python -m relay.spark.jars` to resolve and print the folder, `--classpath` to print the
comma-separated list for `spark-submit --jars`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from relay import maven
from relay.devstack import cache_dir
from relay.spark import PipelineError

SCALA_BINARY_VERSION = "2.13"
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def spark_version() -> str:
    """The installed PySpark version; the connectors must match it exactly."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        raise PipelineError("pyspark is not installed: pip install 'outbox-relay[spark]'") from None


def jars_dir(version: str | None = None) -> Path:
    """Where the connector jars for `version` (default: the installed PySpark) are cached."""
    return cache_dir() / f"spark-jars-{version or spark_version()}"


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
    pom = resources.files("relay.spark") / "spark-pom.xml"
    try:
        maven.copy_dependencies(pom, target, {"spark.version": version,
                                              "scala.binary.version": SCALA_BINARY_VERSION},
                                exclude=shipped_artifacts())
    except maven.MavenError as exc:
        raise PipelineError(
            f"Maven could not resolve the Spark {version} connectors "
            f"(spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}, spark-avro_{SCALA_BINARY_VERSION}):\n{exc}") from exc


def spark_jars(fetch: bool = True) -> list[Path]:
    """The connector jars for the installed PySpark, resolving them on first use.

    Raises PipelineError when they are not cached and `fetch` is false, or Maven fails.
    """
    version = spark_version()
    target = jars_dir(version)
    if not maven.is_resolved(target):
        if not fetch:
            raise PipelineError(f"Spark connector jars not in {target}: run `python -m relay.spark.jars`")
        _resolve(version, target)
    return sorted(target.glob("*.jar"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relay.spark.jars", description=__doc__.splitlines()[0])
    parser.add_argument("--classpath", action="store_true",
                        help="print the jars comma-separated (for spark-submit --jars)")
    args = parser.parse_args(argv)
    try:
        jars = spark_jars()
    except PipelineError as exc:
        print(f"relay.spark.jars: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.classpath:
        print(",".join(str(j) for j in jars))
    else:
        print(f"Spark {spark_version()} connector jars in {jars_dir()}:")
        for jar in jars:
            print(f"  {jar.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

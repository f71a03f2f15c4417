"""Where the Spark connector jars (Kafka source, Avro functions) for the installed PySpark are.

They are resolved once, ahead of time, by the set-up (`make setup`, the container build:
`python -m relay.dev.spark_jars`) into `<cache>/spark-jars-<pyspark version>/` (relay.cachedir).
The jobs pass them to Spark as `spark.jars` (local paths): nothing is resolved at run time (no
`spark.jars.packages`, no Ivy, no Maven), and the jobs import nothing of the dev tooling.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence
from pathlib import Path

from relay.cachedir import cache_dir
from relay.spark import PipelineError

# Written by relay.dev.spark_jars once every jar is in place.
RESOLVED_MARKER = ".complete"


def spark_version() -> str:
    """The installed PySpark version; the connectors must match it exactly."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError as exc:
        raise PipelineError("pyspark is not installed: pip install 'outbox-relay[spark]'") from exc


def jars_dir(version: str | None = None) -> Path:
    """Where the connector jars for `version` (default: the installed PySpark) are cached."""
    return cache_dir() / f"spark-jars-{version or spark_version()}"


def spark_jars() -> list[Path]:
    """The connector jars for the installed PySpark; PipelineError when the set-up has not
    resolved them."""
    target = jars_dir()
    if not (target / RESOLVED_MARKER).exists():
        raise PipelineError(
            f"Spark connector jars not in {target}: run `make setup` (or `python -m relay.dev.spark_jars`) first"
        )
    return sorted(target.glob("*.jar"))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m relay.spark.jars [--classpath]`: print where the jars are (for spark-submit)."""
    parser = argparse.ArgumentParser(prog="python -m relay.spark.jars", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--classpath", action="store_true", help="print the jars comma-separated (for spark-submit --jars)"
    )
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

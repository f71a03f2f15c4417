"""Command-line options shared by the pipeline jobs, and their entry-point wrapper.

Both jobs take the relay's settings (every `RELAY_*` variable, the same flags, `--config`) for
the addresses (MongoDB, Kafka), the outbox and the topic template, plus Spark options. This
module imports no pyspark, so `outbox-relay pipeline --help` works without the `spark` extra.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from relay.config import Settings, load_settings, parse_pairs, settings_parser
from relay.core.errors import ConfigError
from relay.ops.exits import run_command


@dataclass(frozen=True)
class SparkOptions:
    """How to reach Spark and which topics to read."""

    master: str | None
    shuffle_partitions: int
    conf: dict[str, str]
    topics: tuple[str, ...]
    topic_pattern: str | None
    schemas_dir: str | None
    kafka: dict[str, str]  # Java Kafka client properties for the source (`--kafka-option`)


def spark_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the Spark and topic flags to a job's parser."""
    group = parser.add_argument_group("spark")
    group.add_argument("--master", default=None, help="Spark master (default local[*]; ignored under spark-submit)")
    group.add_argument(
        "--shuffle-partitions",
        type=int,
        default=8,
        help="spark.sql.shuffle.partitions; fixed in a streaming checkpoint when it is created (default 8)",
    )
    group.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="any Spark setting, repeatable"
    )
    group.add_argument(
        "--topics", default=None, help="comma-separated topics (default: every topic RELAY_TOPIC_TEMPLATE can produce)"
    )
    group.add_argument("--topic-pattern", default=None, help="Java regex of topics to read instead")
    group.add_argument(
        "--schemas",
        dest="schemas_dir",
        default=None,
        help="folder of writer schemas (.avsc; default: the bundled schemas/)",
    )
    group.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Java Kafka client property for the Kafka source (e.g. "
        "security.protocol=SASL_SSL, sasl.jaas.config=...), repeatable",
    )


def spark_options(args: argparse.Namespace) -> SparkOptions:
    if args.shuffle_partitions < 1:
        raise ConfigError("--shuffle-partitions", "must be at least 1")
    topics = tuple(t.strip() for t in (args.topics or "").split(",") if t.strip())
    return SparkOptions(
        args.master,
        args.shuffle_partitions,
        parse_pairs(args.spark_conf, "--spark-conf"),
        topics,
        args.topic_pattern,
        args.schemas_dir,
        parse_pairs(args.kafka_option, "--kafka-option"),
    )


def job_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A job's parser: the relay's settings flags, then the Spark flags."""
    parser = argparse.ArgumentParser(prog=prog, description=description, parents=[settings_parser()])
    spark_arguments(parser)
    return parser


def load(args: argparse.Namespace) -> Settings:
    """The relay settings from defaults, file, environment and flags (validated)."""
    return load_settings(args)


def run_job(job: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a job's `main`, turning the relay's errors into their exit codes with a message."""
    return run_command("outbox-relay pipeline", lambda: job(argv))

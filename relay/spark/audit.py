"""`audit`: for a time range, did every outbox event reach Kafka, in order, from a current writer?

The time range applies to `occurredAt` and is half-open: `[since, until)`. Sides:
- the outbox: the events whose `occurredAt` is in the range, read with pymongo on the driver
  (one projection of four fields per event; it suits ranges of up to a few million events);
- Kafka: every message of the relay's topics, read in one Spark batch from the earliest to the
  latest offsets, decoded with the registry's schemas (undecodable messages are reported, not
  fatal).

Findings (each with a count and a sample):
- missing: outbox events in the range with no message in Kafka. Fails the audit.
- order violations: per Kafka key (within a topic), the first occurrences of the events in the
  range, taken in (partition, offset) order, must have increasing `source.position` (commit
  order); a pair where a later message carries an earlier position is a violation. A key found
  on several partitions is one too (its order is lost). Fails the audit.
- duplicates: events with more than one message (expected after relay restarts: at least once).
- not in outbox: events in Kafka in the range with no outbox document (deleted by a TTL, or
  written by someone else).
- fencing regressions: along one partition in offset order, a message whose
  `relay_fencing_token` is lower than a token seen earlier in that partition: a message from a
  stale writer (a relay that had lost its lease). Reported for messages whose event is in the
  range; the earlier tokens come from the whole partition. With RELAY_PARTITIONS > 1 each outbox
  partition has its own lease and tokens, and several write into one Kafka partition, so tokens
  are compared per key (a key belongs to one outbox partition) instead of per Kafka partition.
- undecodable messages, messages without a fencing token.

The report is JSON (`--json PATH`, `-` for stdout) and a readable summary. Exit code 0 when the
audit passes, 4 (`EXIT_DATA`) on a missing event or an order violation.

Choose `until` behind the relay's checkpoint (`outbox-relay status`): events committed but not
yet published are reported missing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relay.core.errors import EXIT_DATA, ConfigError, ServerUnreachableError
from relay.core.names import env_name
from relay.core.redact import Properties, Uri, emit, hold_masked, scrub
from relay.outbox import FieldNames
from relay.spark.decode import decode_events, kafka_options, topic_pattern
from relay.spark.options import job_parser, load, run_job, spark_options
from relay.spark.preflight import check_executor_python
from relay.spark.schemas import RegistryAccess, writer_schemas

if TYPE_CHECKING:
    from pymongo.cursor import Cursor
    from pyspark.sql import DataFrame, SparkSession

    from relay.config import Settings

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
FAILING = ("missing", "orderViolations", "keysOnSeveralPartitions")
_OUTBOX_SCHEMA = "id string, aggregateType string, aggregateId string, occurredAt timestamp"


@dataclass(frozen=True)
class AuditConfig:
    """What to compare: the outbox (MongoDB) and the topics (Kafka), for `[since, until)`. The
    addresses and the Kafka options render masked (`Uri`, `Properties`)."""

    mongodb_uri: Uri
    database: str
    outbox_collection: str
    fields: FieldNames
    bootstrap_servers: Uri
    topics: tuple[str, ...]
    topic_pattern: str | None
    since: dt.datetime
    until: dt.datetime
    sample: int = 20
    schemas_dir: str | None = None
    kafka_client: Properties = field(default_factory=Properties)  # `kafka.*` source options
    schema_registry: RegistryAccess | None = None  # for values in the Confluent wire format
    relay_partitions: int = 1  # RELAY_PARTITIONS: > 1 compares fencing tokens per key
    connect_timeout_s: float = 30.0  # RELAY_CONNECT_TIMEOUT_S: how long MongoDB may take to answer

    def __post_init__(self) -> None:
        hold_masked(self, uris=["mongodb_uri", "bootstrap_servers"], properties=["kafka_client"])


# ---- the two sides ---------------------------------------------------------------------------


def outbox_events(spark: SparkSession, cfg: AuditConfig) -> DataFrame:
    """The outbox events in the range (id, aggregateType, aggregateId, occurredAt), via pymongo;
    ServerUnreachableError naming RELAY_MONGODB_URI when MongoDB does not answer in time."""
    from pymongo import MongoClient
    from pymongo.errors import ServerSelectionTimeoutError

    f = cfg.fields
    query = {f.occurred_at: {"$gte": cfg.since, "$lt": cfg.until}}
    projection = {f.aggregate_type: 1, f.aggregate_id: 1, f.occurred_at: 1}
    client: MongoClient[dict[str, Any]]
    timeout_ms = int(cfg.connect_timeout_s * 1000)
    with MongoClient(cfg.mongodb_uri.reveal(), tz_aware=True, serverSelectionTimeoutMS=timeout_ms) as client:
        docs: Cursor[dict[str, Any]] = client[cfg.database][cfg.outbox_collection].find(
            query, projection, batch_size=10_000
        )
        try:
            rows = [(str(d["_id"]), d.get(f.aggregate_type), d.get(f.aggregate_id), d.get(f.occurred_at)) for d in docs]
        except ServerSelectionTimeoutError as exc:
            raise ServerUnreachableError(
                f"cannot reach MongoDB at {cfg.mongodb_uri} within {cfg.connect_timeout_s:g}s "
                f"({env_name('mongodb_uri')})"
            ) from exc
    return spark.createDataFrame(rows, _OUTBOX_SCHEMA)


def kafka_messages(spark: SparkSession, cfg: AuditConfig) -> DataFrame:
    """Every message of the topics, decoded leniently, with the flat columns the checks use."""
    from pyspark.sql import functions as F

    raw = (
        spark.read.format("kafka")
        .options(**kafka_options(cfg.bootstrap_servers.reveal(), cfg.topics, cfg.topic_pattern, dict(cfg.kafka_client)))
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    decoded = decode_events(raw, writer_schemas(cfg.schemas_dir, cfg.schema_registry), strict=False)
    return decoded.select(
        "id",
        "aggregateType",
        "aggregateId",
        "eventType",
        "occurredAt",
        F.col("source.position").alias("position"),
        "topic",
        "partition",
        "offset",
        "key",
        "fencingToken",
        "decodeError",
    )


# ---- the checks ------------------------------------------------------------------------------


def _rows(df: DataFrame, limit: int) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.limit(limit).collect()]


def _finding(df: DataFrame, sample: int) -> dict[str, Any]:
    return {"count": df.count(), "sample": _rows(df, sample)}


def _in_range(messages: DataFrame, cfg: AuditConfig) -> DataFrame:
    from pyspark.sql import functions as F

    return messages.where(
        F.col("decodeError").isNull()
        & (F.col("occurredAt") >= F.lit(cfg.since))
        & (F.col("occurredAt") < F.lit(cfg.until))
    )


def first_occurrences(messages: DataFrame) -> DataFrame:
    """Per event id, its first message (lowest partition, then offset) and how many it has."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("id").orderBy("partition", "offset")
    return (
        messages.withColumn("n", F.row_number().over(w))
        .withColumn("occurrences", F.count(F.lit(1)).over(Window.partitionBy("id")))
        .where("n = 1")
        .drop("n")
    )


def order_violations(firsts: DataFrame) -> DataFrame:
    """Consecutive first occurrences of one key whose positions go backwards."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("topic", "key").orderBy("partition", "offset")
    earlier = F.struct(*[F.lag(c).over(w).alias(c) for c in ("id", "partition", "offset", "position")])
    later = F.struct("id", "partition", "offset", "position")
    return (
        firsts.select("topic", "key", earlier.alias("earlier"), later.alias("later"))
        .where(F.col("earlier.position") > F.col("later.position"))
        .orderBy("topic", "key", "later.offset")
    )


def keys_on_several_partitions(firsts: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        firsts.groupBy("topic", "key")
        .agg(F.sort_array(F.collect_set("partition")).alias("partitions"))
        .where(F.size("partitions") > 1)
        .orderBy("topic", "key")
    )


def fencing_regressions(messages: DataFrame, per_key: bool = False) -> DataFrame:
    """Messages whose fencing token is lower than one earlier in the same Kafka partition (with
    `per_key`, earlier in the same Kafka partition for the same key: one writer's token sequence
    when several outbox partitions, each with its own lease, write into one Kafka partition)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    within = ("topic", "partition", "key") if per_key else ("topic", "partition")
    w = Window.partitionBy(*within).orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    return (
        messages.withColumn("highestEarlierToken", F.max("fencingToken").over(w))
        .where(F.col("fencingToken") < F.col("highestEarlierToken"))
        .select("topic", "partition", "offset", "id", "occurredAt", "fencingToken", "highestEarlierToken")
        .orderBy("topic", "partition", "offset")
    )


def _extra_messages(duplicated: DataFrame) -> int:
    """Messages beyond the first, over events with several (their `occurrences` column)."""
    from pyspark.sql import functions as F

    row = duplicated.agg(F.sum(F.col("occurrences") - 1)).first()
    return int(row[0] or 0) if row is not None else 0


def audit(spark: SparkSession, cfg: AuditConfig) -> dict[str, Any]:
    """Compare the outbox with Kafka for the range; the report as a JSON-ready dict. First,
    PipelineError (one line) when the executors cannot start a Python worker, which Spark needs
    for the outbox rows (relay.spark.preflight)."""
    check_executor_python(spark, package=False)
    outbox = outbox_events(spark, cfg).cache()
    messages = kafka_messages(spark, cfg).cache()
    in_range = _in_range(messages, cfg)
    firsts = first_occurrences(in_range).cache()
    try:
        report: dict[str, Any] = {
            "range": {"since": cfg.since.isoformat(), "until": cfg.until.isoformat()},
            "topics": list(cfg.topics) or cfg.topic_pattern,
            "outbox": {"events": outbox.count()},
            "kafka": {
                "messages": messages.count(),
                "messagesInRange": in_range.count(),
                "eventsInRange": firsts.count(),
            },
            **_findings(cfg, outbox, messages, in_range, firsts),
        }
    finally:
        for cached in (firsts, messages, outbox):
            cached.unpersist()
    report["failures"] = [name for name in FAILING if report[name]["count"]]
    report["passed"] = not report["failures"]
    return report


def _findings(
    cfg: AuditConfig, outbox: DataFrame, messages: DataFrame, in_range: DataFrame, firsts: DataFrame
) -> dict[str, Any]:
    """Each finding of the audit: a count and a sample (relay.spark.audit.FAILING fail it)."""
    from pyspark.sql import functions as F

    decoded = messages.where(F.col("decodeError").isNull())
    dups = firsts.where("occurrences > 1")
    stale = fencing_regressions(decoded, per_key=cfg.relay_partitions > 1)
    return {
        "missing": _finding(
            outbox.join(decoded.select("id").distinct(), "id", "left_anti").orderBy("occurredAt", "id"), cfg.sample
        ),
        "orderViolations": _finding(order_violations(firsts), cfg.sample),
        "keysOnSeveralPartitions": _finding(keys_on_several_partitions(firsts), cfg.sample),
        "duplicates": {
            **_finding(dups.select("id", "topic", "key", "occurrences").orderBy("id"), cfg.sample),
            "extraMessages": _extra_messages(dups),
        },
        "notInOutbox": _finding(
            firsts.join(outbox.select("id"), "id", "left_anti")
            .select("id", "topic", "partition", "offset", "aggregateId", "occurredAt")
            .orderBy("id"),
            cfg.sample,
        ),
        "fencingRegressions": _finding(
            stale.where(F.col("occurredAt") >= F.lit(cfg.since)).where(F.col("occurredAt") < F.lit(cfg.until)),
            cfg.sample,
        ),
        "undecodable": _finding(
            messages.where(F.col("decodeError").isNotNull()).select("topic", "partition", "offset", "decodeError"),
            cfg.sample,
        ),
        "withoutFencingToken": {"count": in_range.where(F.col("fencingToken").isNull()).count()},
    }


def summary(report: dict[str, Any]) -> str:
    """A readable account of the report, one finding per line, with the verdict last."""
    lines = [
        f"audit of {report['topics']} for occurredAt in [{report['range']['since']}, {report['range']['until']})",
        f"  outbox events in range      {report['outbox']['events']}",
        f"  kafka messages              {report['kafka']['messages']} "
        f"({report['kafka']['messagesInRange']} in range, {report['kafka']['eventsInRange']} distinct events)",
    ]
    notes = {
        "missing": "outbox events with no message (FAIL)",
        "orderViolations": "first occurrences out of commit order (FAIL)",
        "keysOnSeveralPartitions": "keys spread over partitions (FAIL)",
        "duplicates": f"events published more than once ({report['duplicates']['extraMessages']} extra "
        "messages; expected after restarts)",
        "notInOutbox": "events in Kafka with no outbox document",
        "fencingRegressions": "messages from a stale writer (fencing token went down)",
        "undecodable": "messages no schema decodes",
        "withoutFencingToken": "messages without relay_fencing_token",
    }
    for name, note in notes.items():
        lines.append(f"  {name:<27} {report[name]['count']:<8} {note}")
        for item in report[name].get("sample", [])[:5]:
            lines.append(f"      {json.dumps(item, default=str)}")
    lines.append("  result: " + ("PASS" if report["passed"] else f"FAIL ({', '.join(report['failures'])})"))
    return "\n".join(lines)


# ---- command line ----------------------------------------------------------------------------


def _time(value: str | None, name: str, default: dt.datetime) -> dt.datetime:
    if value is None:
        return default
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError(name, f"expected an ISO-8601 time, got {value!r}") from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _parser() -> argparse.ArgumentParser:
    parser = job_parser("outbox-relay pipeline audit", __doc__.splitlines()[0])
    job = parser.add_argument_group("audit")
    job.add_argument("--since", default=None, help="start of the range, ISO-8601, inclusive (default: the epoch)")
    job.add_argument("--until", default=None, help="end of the range, ISO-8601, exclusive (default: now)")
    job.add_argument("--json", dest="json_path", default=None, help="write the JSON report here ('-': stdout)")
    job.add_argument("--sample", type=int, default=20, help="examples kept per finding (default 20)")
    return parser


def config_from_args(args: argparse.Namespace) -> AuditConfig:
    settings = load(args)
    spark_opts = spark_options(args)
    since = _time(args.since, "--since", EPOCH)
    until = _time(args.until, "--until", dt.datetime.now(dt.UTC))
    if until <= since:
        raise ConfigError("--until", "must be later than --since")
    return AuditConfig(
        mongodb_uri=settings.parts().mongo.uri,
        database=settings.database,
        outbox_collection=settings.outbox_collection,
        fields=settings.parts().encoding.fields,
        bootstrap_servers=settings.parts().kafka.bootstrap_servers,
        topics=spark_opts.topics,
        topic_pattern=spark_opts.topic_pattern or topic_pattern(settings.topic_template),
        since=since,
        until=until,
        sample=args.sample,
        schemas_dir=spark_opts.schemas_dir,
        kafka_client=Properties(spark_opts.kafka),
        schema_registry=RegistryAccess.from_settings(settings),
        relay_partitions=settings.partitions,
        connect_timeout_s=settings.connect_timeout_s,
    )


def check_outbox_server(settings: Settings) -> None:
    """Before Spark starts: ServerUnreachableError (exit 3) when MongoDB does not answer within
    RELAY_CONNECT_TIMEOUT_S, ConfigError (exit 2) when it refuses the credentials, each naming
    RELAY_MONGODB_URI without its password (relay.mongo.connection.check_mongodb)."""
    from relay.mongo.connection import check_mongodb, mongo_client

    mongo = settings.parts().mongo
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the audit, print the summary (stderr when the JSON goes to stdout), write the JSON;
    0 when it passes, EXIT_DATA (4) on a missing event or an order violation."""
    from relay.spark.session import active_session, setup_job_logging, spark_session

    args = _parser().parse_args(argv)
    cfg = config_from_args(args)
    settings = load(args)
    setup_job_logging(settings)
    check_outbox_server(settings)
    spark_opts = spark_options(args)
    owned = active_session() is None
    spark = spark_session("outbox-relay audit", spark_opts.master, spark_opts.shuffle_partitions, spark_opts.conf)
    try:
        report = audit(spark, cfg)
    finally:
        if owned:
            spark.stop()
    text = json.dumps(report, indent=2, default=str)
    emit(summary(report), sys.stderr if args.json_path == "-" else sys.stdout)
    if args.json_path == "-":
        emit(text)
    elif args.json_path:
        with open(args.json_path, "w") as out:
            out.write(scrub(text) + "\n")
    return 0 if report["passed"] else EXIT_DATA


if __name__ == "__main__":
    sys.exit(run_job(main))

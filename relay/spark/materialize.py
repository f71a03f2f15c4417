"""`materialize`: the relay's topics -> an event table and a per-aggregate state view.

Two Structured Streaming queries, each with its own checkpoint under `--checkpoint`
(default `<output>/_checkpoints`):

1. `outbox-events`: Kafka (every topic the relay's template can produce, with headers) ->
   Avro decoding with the registry's writer schemas (relay.spark.decode) -> duplicates dropped
   by event id (streaming de-duplication: state holds every id seen; `--dedup-window` bounds it
   by Kafka time instead) -> `<output>/events`, append-only Parquet partitioned by
   `aggregateType` and `eventDate` (UTC date of occurredAt). The file sink commits each
   micro-batch in its `_spark_metadata` log, so with the checkpoint it is exactly-once: read the
   table with Spark (it follows the log; files of a batch that was killed are on disk but not
   in the log).
2. `outbox-state`: the event table, read as a stream through that same log (each event once)
   -> per-aggregate state (relay.spark.state: last event by source position, distinct event
   count) in update mode -> each micro-batch's changed aggregates merged into a Parquet
   snapshot under `<output>/state` and upserted into MongoDB, both version-conditioned.

Killed at any moment and restarted on the same checkpoint, each query replays the micro-batch it
had not committed with the same input: the file sink skips or rewrites it, the snapshot for that
batch is rewritten, and the MongoDB upserts of equal versions change nothing. Nothing is lost
(Kafka offsets and file-log positions are in the checkpoints) and nothing is doubled.

The outputs belong to their checkpoints: starting with outputs but no checkpoint is refused
(a new checkpoint would renumber batches and skip or repeat data). Delete both to rebuild.

Before its queries, `check_cluster` stops the job with one line when the executors cannot run
its Python code or write where the driver sees (relay.spark.preflight).

Run: `outbox-relay pipeline materialize --output DIR [--once]`, or under `spark-submit` as
docs/spark.md shows (`PYSPARK_PYTHON` naming an interpreter with this package on every node,
`--jars $(python -m relay.spark.jars --classpath)`, then this file and the same flags).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relay.core.redact import Properties, Uri, hold_masked, register_secrets
from relay.core.signals import stopping_on_signals
from relay.mongo.config import uri_credentials
from relay.spark import PipelineError
from relay.spark.decode import decode_events, kafka_options, topic_pattern
from relay.spark.options import SparkOptions, job_parser, load, run_job, spark_options
from relay.spark.preflight import check_executor_python, check_shared_folder, is_local_master
from relay.spark.schemas import RegistryAccess, writer_schemas
from relay.spark.state import HadoopFs, MongoStateView, ParquetStateSnapshots, aggregate_state

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

    from relay.config import Settings

log = logging.getLogger("relay.spark.materialize")

EVENTS_QUERY = "outbox-events"
STATE_QUERY = "outbox-state"
PARTITION_COLUMNS = ("aggregateType", "eventDate")
DEFAULT_VIEW_COLLECTION = "outbox_aggregate_state"


@dataclass(frozen=True)
class MongoView:
    """Where the MongoDB read model lives (the URI renders masked: a `Uri`)."""

    uri: Uri
    database: str
    collection: str

    def __post_init__(self) -> None:
        hold_masked(self, uris=["uri"])


@dataclass(frozen=True)
class MaterializeConfig:
    """Everything the job needs; paths may be any Hadoop-supported URI. The servers and the Kafka
    options render masked (`Uri`, `Properties`)."""

    bootstrap_servers: Uri
    topics: tuple[str, ...]
    topic_pattern: str | None
    output: str
    checkpoint: str
    view: MongoView | None
    once: bool = False
    interval_s: float = 10.0
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    dedup_window: str | None = None
    schemas_dir: str | None = None
    kafka_client: Properties = field(default_factory=Properties)  # `kafka.*` source options
    schema_registry: RegistryAccess | None = None  # for values in the Confluent wire format

    def __post_init__(self) -> None:
        hold_masked(self, uris=["bootstrap_servers"], properties=["kafka_client"])

    @property
    def events_path(self) -> str:
        return f"{self.output.rstrip('/')}/events"

    @property
    def state_path(self) -> str:
        return f"{self.output.rstrip('/')}/state"

    def checkpoint_of(self, query: str) -> str:
        return f"{self.checkpoint.rstrip('/')}/{query}"


# ---- query 1: the event table ----------------------------------------------------------------


def event_stream(spark: SparkSession, cfg: MaterializeConfig) -> DataFrame:
    """Decoded, de-duplicated events with their `eventDate`: the event table's rows."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("kafka").options(
        **kafka_options(cfg.bootstrap_servers.reveal(), cfg.topics, cfg.topic_pattern, dict(cfg.kafka_client))
    )
    reader = reader.option("startingOffsets", cfg.starting_offsets)
    if cfg.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    events = decode_events(reader.load(), writer_schemas(cfg.schemas_dir, cfg.schema_registry)).drop("decodeError")
    if cfg.dedup_window:
        events = events.withWatermark("kafkaTimestamp", cfg.dedup_window).dropDuplicatesWithinWatermark(["id"])
    else:
        events = events.dropDuplicates(["id"])
    return events.withColumn("eventDate", F.to_date("occurredAt"))


def _trigger(cfg: MaterializeConfig) -> dict[str, Any]:
    return {"availableNow": True} if cfg.once else {"processingTime": f"{cfg.interval_s} seconds"}


def start_event_table(events: DataFrame, cfg: MaterializeConfig) -> StreamingQuery:
    """Start query 1: `events` appended to the partitioned Parquet table, exactly once per batch."""
    return (
        events.writeStream.queryName(EVENTS_QUERY)
        .format("parquet")
        .option("path", cfg.events_path)
        .option("checkpointLocation", cfg.checkpoint_of(EVENTS_QUERY))
        .partitionBy(*PARTITION_COLUMNS)
        .outputMode("append")
        .trigger(**_trigger(cfg))
        .start()
    )


# ---- query 2: the state view -----------------------------------------------------------------


class StateSink:
    """foreachBatch target: one micro-batch of changed aggregate states -> Parquet, MongoDB."""

    def __init__(self, spark: SparkSession, cfg: MaterializeConfig) -> None:
        self._snapshots = ParquetStateSnapshots(spark, cfg.state_path)
        view = cfg.view
        self._mongo = MongoStateView(view.uri.reveal(), view.database, view.collection) if view else None

    def __call__(self, updates: DataFrame, batch_id: int) -> None:
        """Idempotent: a replay of `batch_id` rewrites the same snapshot and upserts the same
        versions (which MongoDB then finds not newer)."""
        updates = updates.persist()  # two writers read it; the aggregation runs once
        try:
            self._snapshots.write(updates, batch_id)
            if self._mongo is not None:
                self._mongo.write(updates)
        finally:
            updates.unpersist()


def event_table_ready(spark: SparkSession, cfg: MaterializeConfig) -> bool:
    """The event table has a committed batch and its partition folders: a file source started
    now follows its `_spark_metadata` log (only committed files) and learns the partition columns
    from the folder names (a source started on an empty folder would know neither)."""
    committed = HadoopFs(spark, f"{cfg.events_path}/_spark_metadata").children(directories_only=False)
    partitions = HadoopFs(spark, cfg.events_path).children()
    return bool(committed) and any(p.startswith(f"{PARTITION_COLUMNS[0]}=") for p in partitions)


def start_state_view(spark: SparkSession, cfg: MaterializeConfig, table_schema: StructType) -> StreamingQuery:
    """Start the state query; call only once `event_table_ready`."""
    events = spark.readStream.schema(table_schema).parquet(cfg.events_path)
    return (
        aggregate_state(events)
        .writeStream.queryName(STATE_QUERY)
        .outputMode("update")
        .foreachBatch(StateSink(spark, cfg))
        .option("checkpointLocation", cfg.checkpoint_of(STATE_QUERY))
        .trigger(**_trigger(cfg))
        .start()
    )


# ---- running ---------------------------------------------------------------------------------


def _progress_listener() -> Any:
    """A listener logging one line per micro-batch: query, batch id, rows, durations."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressLog(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            log.info(
                "%s batch %d: %d rows in %d ms %s",
                p.name,
                p.batchId,
                p.numInputRows,
                p.durationMs.get("triggerExecution", 0),
                dict(p.durationMs),
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if event.exception:
                log.error("query %s failed: %s", event.id, event.exception.splitlines()[0])

    return ProgressLog()


def check_outputs_have_checkpoints(spark: SparkSession, cfg: MaterializeConfig) -> None:
    """Raises PipelineError when an output exists without the checkpoint that wrote it."""
    checkpoints = HadoopFs(spark, cfg.checkpoint)
    events_log = HadoopFs(spark, f"{cfg.events_path}/_spark_metadata")
    if events_log.children(directories_only=False) and not checkpoints.exists(EVENTS_QUERY, "offsets"):
        raise PipelineError(
            f"{cfg.events_path} holds an event table but {cfg.checkpoint_of(EVENTS_QUERY)} "
            "has no checkpoint; restore the checkpoint, or delete the output to rebuild it"
        )
    if ParquetStateSnapshots(spark, cfg.state_path).exists() and not checkpoints.exists(STATE_QUERY, "offsets"):
        raise PipelineError(
            f"{cfg.state_path} holds a state view but {cfg.checkpoint_of(STATE_QUERY)} has "
            "no checkpoint; restore the checkpoint, or delete the output to rebuild it"
        )


def check_cluster(spark: SparkSession, cfg: MaterializeConfig) -> None:
    """Raises PipelineError, before any query starts, when the executors cannot run the job's
    Python code (the MongoDB view's writes) or, on a cluster, when what they write under the
    output or the checkpoint is not visible to the driver (relay.spark.preflight)."""
    if cfg.view is not None:
        log.info("executors run %s", check_executor_python(spark))
    if is_local_master(spark):
        return
    check_shared_folder(spark, cfg.output, "--output")
    if not _inside(cfg.checkpoint, cfg.output):
        check_shared_folder(spark, cfg.checkpoint, "--checkpoint")


def _inside(path: str, folder: str) -> bool:
    return path.rstrip("/").startswith(folder.rstrip("/") + "/")


def _failure(query: StreamingQuery) -> PipelineError | None:
    exc = query.exception()
    if exc is None:
        return None
    return PipelineError(f"query {query.name} failed: {getattr(exc, 'desc', None) or exc}")


def _await(queries: Sequence[StreamingQuery], stop: threading.Event) -> None:
    """Block until every query terminated (availableNow) or `stop` is set; raise on failure."""
    while not stop.is_set() and any(q.isActive for q in queries):
        for q in queries:
            if not q.isActive and (error := _failure(q)) is not None:
                raise error
        stop.wait(0.5)
    for q in queries:
        if q.isActive:
            q.stop()
    for q in queries:
        if (error := _failure(q)) is not None:
            raise error


@dataclass
class QueryRun:
    """What one query did in a `materialize` call (rows and batches from its recent progress,
    which keeps the last 100 micro-batches)."""

    name: str
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0
    batches: int = 0
    rows: int = 0

    def finish(self, query: StreamingQuery) -> None:
        self.seconds = time.monotonic() - self.started
        progress = query.recentProgress
        self.batches = len(progress)
        self.rows = sum(p["numInputRows"] for p in progress)


def materialize(
    spark: SparkSession, cfg: MaterializeConfig, stop: threading.Event | None = None, log_progress: bool = False
) -> list[QueryRun]:
    """Run the two queries: with `cfg.once` until all available data is processed (events
    first, then the state view), else until `stop` is set. Raises PipelineError if a query fails.
    With `log_progress`, one log line per micro-batch. Returns what each query did."""
    stop = stop or threading.Event()
    check_outputs_have_checkpoints(spark, cfg)
    check_cluster(spark, cfg)
    listener = _progress_listener() if log_progress else None
    if listener is not None:
        spark.streams.addListener(listener)
    events = event_stream(spark, cfg)
    runs = [QueryRun(EVENTS_QUERY)]
    queries = [start_event_table(events, cfg)]
    try:
        if cfg.once:
            _await(queries, stop)
            runs[0].finish(queries[0])
        while not stop.is_set() and not event_table_ready(spark, cfg):
            if not queries[0].isActive:  # once: the topics hold no event yet; else: it failed
                if (error := _failure(queries[0])) is not None:
                    raise error
                return runs
            stop.wait(0.5)
        if stop.is_set():
            return runs
        runs.append(QueryRun(STATE_QUERY))
        queries.append(start_state_view(spark, cfg, events.schema))
        _await(queries[1:] if cfg.once else queries, stop)
        for run, query in zip(runs, queries, strict=True):
            if not cfg.once or run.name == STATE_QUERY:
                run.finish(query)
        return runs
    finally:
        for q in queries:
            if q.isActive:
                q.stop()
        if listener is not None:
            spark.streams.removeListener(listener)


# ---- command line ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = job_parser("outbox-relay pipeline materialize", __doc__.splitlines()[0])
    job = parser.add_argument_group("materialize")
    job.add_argument("--output", required=True, help="folder (or URI) for events/ and state/")
    job.add_argument("--checkpoint", default=None, help="checkpoint folder (default <output>/_checkpoints)")
    job.add_argument(
        "--once", action="store_true", help="process what the topics hold now, then stop (trigger availableNow)"
    )
    job.add_argument("--interval", type=float, default=10.0, help="seconds between micro-batches (default 10)")
    job.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=None,
        help="most Kafka messages per micro-batch (default: all available)",
    )
    job.add_argument(
        "--starting-offsets",
        default="earliest",
        help="where a new checkpoint starts reading: earliest (default) or latest",
    )
    job.add_argument(
        "--dedup-window",
        default=None,
        help="bound the de-duplication state to this Kafka-time window, e.g. '7 days' "
        "(default: remember every event id)",
    )
    job.add_argument(
        "--view-collection",
        default=DEFAULT_VIEW_COLLECTION,
        help=f"MongoDB collection of the read model (default {DEFAULT_VIEW_COLLECTION})",
    )
    job.add_argument("--view-database", default=None, help="its database (default RELAY_DATABASE)")
    job.add_argument("--view-uri", default=None, help="its MongoDB URI (default RELAY_MONGODB_URI)")
    job.add_argument("--no-mongo-view", action="store_true", help="write the Parquet state view only")
    return parser


def absolute(path: str) -> str:
    """`path` made absolute against this process's working directory when it is a relative local
    path (no URI scheme): the driver and the executors would each resolve it against their own
    working directory."""
    if urllib.parse.urlparse(path).scheme or os.path.isabs(path):
        return path
    return os.path.abspath(path)


def config_from_args(args: argparse.Namespace) -> tuple[MaterializeConfig, SparkOptions, Settings]:
    """The job's configuration from parsed flags and the relay settings (validated)."""
    settings = load(args)
    spark_opts = spark_options(args)
    output = absolute(args.output)
    if args.view_uri:
        register_secrets(uri_credentials(args.view_uri))  # masked in every line, like RELAY_MONGODB_URI's
    view = (
        None
        if args.no_mongo_view
        else MongoView(
            Uri(args.view_uri or settings.mongodb_uri), args.view_database or settings.database, args.view_collection
        )
    )
    cfg = MaterializeConfig(
        bootstrap_servers=settings.parts().kafka.bootstrap_servers,
        topics=spark_opts.topics,
        topic_pattern=spark_opts.topic_pattern or topic_pattern(settings.topic_template),
        output=output,
        checkpoint=absolute(args.checkpoint) if args.checkpoint else f"{output.rstrip('/')}/_checkpoints",
        view=view,
        once=args.once,
        interval_s=args.interval,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets=args.starting_offsets,
        dedup_window=args.dedup_window,
        schemas_dir=spark_opts.schemas_dir,
        kafka_client=Properties(spark_opts.kafka),
        schema_registry=RegistryAccess.from_settings(settings),
    )
    return cfg, spark_opts, settings


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, build the session, run until done (`--once`) or SIGTERM/SIGINT (then the running
    micro-batch is abandoned; the restart replays it)."""
    from relay.spark.session import active_session, setup_job_logging, spark_session

    args = _parser().parse_args(argv)
    cfg, spark_opts, settings = config_from_args(args)
    setup_job_logging(settings)
    stop = threading.Event()
    with stopping_on_signals(stop.set, says="stopping the queries"):
        owned = active_session() is None
        spark = spark_session(
            "outbox-relay materialize", spark_opts.master, spark_opts.shuffle_partitions, spark_opts.conf
        )
        log.info(
            "materialize %s -> %s (checkpoint %s)%s",
            cfg.topics or cfg.topic_pattern,
            cfg.output,
            cfg.checkpoint,
            " once" if cfg.once else f" every {cfg.interval_s}s",
        )
        try:
            for run in materialize(spark, cfg, stop, log_progress=True):
                log.info("%s: %d rows in %d micro-batches, %.1f s", run.name, run.rows, run.batches, run.seconds)
        finally:
            if owned:
                spark.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))

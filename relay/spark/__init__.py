"""PySpark jobs over the relay's topics: `materialize` (event table + per-aggregate state view)
and `audit` (outbox versus Kafka for a time range).

Modules, one concern each:
  jars.py         where the Kafka and Avro connector jars for the pinned PySpark are (resolved
                  once by the set-up, relay.dev.spark_jars; `python -m relay.spark.jars
                  --classpath` lists them), passed to Spark via `spark.jars`
  session.py      the SparkSession: connector jars, UTC, temp dirs, RocksDB state store
  preflight.py    checks before a query starts on a cluster: the executors import this package,
                  the output is storage every node shares
  schemas.py      the writer schemas of the registry folder, with their fingerprints
  decode.py       Kafka rows -> the common event columns (single-object or Confluent framing)
  state.py        the per-aggregate state: its definition, the Parquet snapshots, the MongoDB
                  read model with version-conditioned upserts
  materialize.py  the streaming job; audit.py the batch job; options.py their shared flags;
                  pipeline.py the `outbox-relay pipeline` entry point

Nothing here is imported by the relay itself; `pyspark` comes with the `spark` extra.
"""

from __future__ import annotations

from relay.core.errors import EXIT_FATAL, RelayError


class PipelineError(RelayError):
    """Raised when a pipeline job cannot run as asked (missing jars, output without its
    checkpoint, an undecodable message); the message names what to fix."""

    exit_code = EXIT_FATAL

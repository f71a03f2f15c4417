"""Kafka rows -> the common event columns, decoded with the registry's writer schemas.

A value names its writer schema in one of two framings: Avro single-object encoding (`C3 01`,
the schema's 8-byte fingerprint, the Avro body from byte 11, 1-based) or the Confluent wire
format (byte `00`, a 4-byte big-endian Schema Registry id, the body from byte 6). For each writer
schema there is one branch: "single-object marker and its fingerprint, or Confluent marker and
one of its registry ids (`WriterSchema.confluent_ids`) -> `from_avro(body, schema_json)`",
normalized to the common columns (payload as JSON text: as is for the generic envelope,
`to_json` for a typed record). Both framings of one schema share the branch, so they decode to
identical rows.
The branches are columns of one projection (null where the fingerprint differs), combined by one
CASE expression, rather than a union of filtered copies of the stream: each Kafka batch is read
once and each value decoded once, whatever the number of schemas.

A value no branch matches (unknown fingerprint, other framing) fails the query, naming the
message (strict, the default: a message is never skipped silently; add its schema to
`schemas/` and restart from the checkpoint), or yields a row whose event columns are null with
`decodeError` set (`strict=False`, for the audit, which reports such messages).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from relay.avro.wire import SINGLE_OBJECT_MAGIC
from relay.core.message import HEADER_FENCING
from relay.spark.schemas import WriterSchema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

BODY_START = len(SINGLE_OBJECT_MAGIC) + 8 + 1  # 1-based position of the Avro body (single-object)
CONFLUENT_BODY_START = 1 + 4 + 1  # after the magic byte 00 and the 4-byte schema id
CONFLUENT_MAGIC = b"\x00"
_PLACEHOLDER = re.compile(r"\{(aggregateType|eventType)\}")

# The columns `decode_events` returns, in order.
EVENT_COLUMNS = ("id", "aggregateType", "aggregateId", "eventType", "occurredAt", "payload", "source", "writerSchema")
KAFKA_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "kafkaTimestamp",
    "key",
    "fencingToken",
    "traceparent",
    "tracestate",
    "decodeError",
)


def topic_pattern(template: str) -> str:
    """A Java regex matching every topic the relay's template can produce.

    `outbox.event.{aggregateType}` -> `outbox\\.event\\.[A-Za-z0-9._-]+`.
    """
    parts = _PLACEHOLDER.split(template)
    # split() with one group alternates literal text and placeholder names.
    return "".join(re.escape(p) if i % 2 == 0 else "[A-Za-z0-9._-]+" for i, p in enumerate(parts))


def kafka_options(
    bootstrap_servers: str, topics: Sequence[str] | None, pattern: str | None, client: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Kafka source options: the given topics, else the pattern; always with headers; `client`
    holds Java Kafka client properties (security, ...), passed as `kafka.<property>`.

    The isolation level is read_committed unless `client` sets `isolation.level`: the messages of
    aborted Kafka transactions (an exactly-once relay that was killed or fenced mid-transaction,
    docs/exactly-once.md) are never read, and a batch read ends at the last stable offset. For a
    relay in at-least-once mode it changes nothing (no transactions)."""
    options = {"kafka.isolation.level": "read_committed"}
    options.update({f"kafka.{k}": v for k, v in (client or {}).items()})
    options.update({"kafka.bootstrap.servers": bootstrap_servers, "includeHeaders": "true"})
    if topics:
        options["subscribe"] = ",".join(topics)
    elif pattern:
        options["subscribePattern"] = pattern
    else:
        raise ValueError("give topics or a topic pattern")
    return options


def _single_object(value: Column) -> Column:
    from pyspark.sql import functions as F

    return F.substr(value, F.lit(1), F.lit(2)) == F.lit(SINGLE_OBJECT_MAGIC)


def _confluent(value: Column) -> Column:
    from pyspark.sql import functions as F

    return (F.substr(value, F.lit(1), F.lit(1)) == F.lit(CONFLUENT_MAGIC)) & (F.length(value) >= 5)


def _schema_id(value: Column) -> Column:
    """The Confluent schema id (4 bytes after the magic byte) as binary."""
    from pyspark.sql import functions as F

    return F.substr(value, F.lit(2), F.lit(4))


def _decoded(value: Column, schema: WriterSchema) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    start = (
        F.when(_single_object(value), F.lit(BODY_START)).otherwise(F.lit(CONFLUENT_BODY_START))
        if schema.confluent_ids
        else F.lit(BODY_START)
    )
    return from_avro(F.substr(value, start), schema.json, {"mode": "FAILFAST"})


def _normalized(d: Column, schema: WriterSchema) -> Column:
    """One schema's decoded record as the common struct (payload as JSON text)."""
    from pyspark.sql import functions as F

    src = d["source"]
    return F.struct(
        d["id"].alias("id"),
        d["aggregateType"].alias("aggregateType"),
        d["aggregateId"].alias("aggregateId"),
        d["eventType"].alias("eventType"),
        d["occurredAt"].cast("timestamp").alias("occurredAt"),
        (d["payload"] if schema.payload_is_text else F.to_json(d["payload"])).alias("payload"),
        F.struct(
            src["database"].alias("database"),
            src["collection"].alias("collection"),
            src["clusterTime"].cast("long").alias("clusterTime"),
            src["position"].alias("position"),
        ).alias("source"),
        F.lit(schema.name).alias("writerSchema"),
    )


def _undecodable_reason(value: Column) -> Column:
    from pyspark.sql import functions as F

    confluent = F.concat(
        F.lit("no writer schema for Schema Registry id "),
        F.conv(F.hex(_schema_id(value)), 16, 10),
        F.lit(
            " (Confluent wire format): give the jobs the registry the relay writes to "
            "(--schema-registry-url / RELAY_SCHEMA_REGISTRY_URL); a schema registered after the job "
            "started is read when it restarts"
        ),
    )
    single_object = F.concat(
        F.lit("no writer schema for fingerprint "),
        F.hex(F.substr(value, F.lit(3), F.lit(8))),
        F.lit(" (marker "),
        F.hex(F.substr(value, F.lit(1), F.lit(2))),
        F.lit(f"; expected {SINGLE_OBJECT_MAGIC.hex().upper()} and a schema in schemas/)"),
    )
    return F.when(_confluent(value), confluent).otherwise(single_object)


def _message_name() -> Column:
    from pyspark.sql import functions as F

    return F.concat(
        F.lit("message "),
        F.col("topic"),
        F.lit("["),
        F.col("partition").cast("string"),
        F.lit("]@"),
        F.col("offset").cast("string"),
    )


def _header(name: str) -> Column:
    """The first header called `name`, as text (null if absent)."""
    from pyspark.sql import functions as F

    header = F.try_element_at(F.filter("headers", lambda h: h["key"] == F.lit(name)), F.lit(1))
    return header["value"].cast("string")


def _fencing_token() -> Column:
    return _header(HEADER_FENCING).try_cast("long")


def _branches(schemas: Sequence[WriterSchema]) -> list[Column]:
    """Stage 1: one column per schema, decoded only where the value names it (marker and
    fingerprint, or Confluent marker and one of its registry ids), else null."""
    from pyspark.sql import functions as F

    value = F.col("value")
    fp = F.substr(value, F.lit(3), F.lit(8))
    branches = []
    for i, s in enumerate(schemas):
        names_it = _single_object(value) & (fp == F.lit(s.fingerprint))
        if s.confluent_ids:
            ids = [F.lit(schema_id.to_bytes(4, "big")) for schema_id in sorted(s.confluent_ids)]
            names_it = names_it | (_confluent(value) & _schema_id(value).isin(*ids))
        branches.append(F.when(names_it, _decoded(value, s)).alias(f"_d{i}"))
    return branches


def _event(schemas: Sequence[WriterSchema], strict: bool) -> Column:
    """Stage 2: the common struct from whichever branch decoded the value; else fail or null."""
    from pyspark.sql import functions as F

    event: Column | None = None
    for i, schema in enumerate(schemas):
        d = F.col(f"_d{i}")
        event = (
            F.when(d.isNotNull(), _normalized(d, schema))
            if event is None
            else event.when(d.isNotNull(), _normalized(d, schema))
        )
    assert event is not None
    if not strict:
        return event.otherwise(F.lit(None))
    reason = _undecodable_reason(F.col("value"))
    return event.otherwise(F.raise_error(F.concat(F.lit("undecodable "), _message_name(), F.lit(": "), reason)))


def decode_events(kafka: DataFrame, schemas: Sequence[WriterSchema], strict: bool = True) -> DataFrame:
    """The Kafka source's rows (read with `includeHeaders`) as `EVENT_COLUMNS + KAFKA_COLUMNS`.

    `fencingToken` is the `relay_fencing_token` header as a number (null if absent or not a
    number); `traceparent` and `tracestate` the W3C trace context headers (null without one); `key` the Kafka key as text. With `strict`, an undecodable value fails the query with
    an error naming the message; otherwise its event columns are null and `decodeError` says why.
    """
    from pyspark.sql import functions as F

    if not schemas:
        raise ValueError("no writer schemas")
    # The stages are separate projections: stage 2 reads each branch column several times, and
    # Spark keeps a costly column in its own projection rather than re-running from_avro per use.
    stage1 = kafka.select("value", "topic", "partition", "offset", "timestamp", "key", "headers", *_branches(schemas))
    stage2 = stage1.select(
        _event(schemas, strict).alias("e"),
        "value",
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafkaTimestamp"),
        F.col("key").cast("string").alias("key"),
        _fencing_token().alias("fencingToken"),
        _header("traceparent").alias("traceparent"),
        _header("tracestate").alias("tracestate"),
    )
    error = F.lit(None).cast("string") if strict else F.when(F.col("e").isNull(), _undecodable_reason(F.col("value")))
    return stage2.select(
        *[F.col("e")[c].alias(c) for c in EVENT_COLUMNS],
        *KAFKA_COLUMNS[:-1],
        error.alias("decodeError"),
    )

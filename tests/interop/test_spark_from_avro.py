"""Interop: Spark's `from_avro` (spark-avro, the Java Avro library inside Spark) decodes every
schema the relay writes, and the common envelope columns select the same way for all of them.

Skipped unless `pyspark` is importable (the `spark` extra; issue 6 adds PySpark to the test
set-up). It runs in the Spark tests' session (the `spark` fixture, tests/conftest.py: the
connector jars from `relay.spark.jars`, Maven, cached). Values are Avro
single-object encoded: the Avro body starts at byte 11 (1-based), after `C3 01` and the
8-byte fingerprint that selects the schema.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra, issue 6)")

from relay.config import Settings
from relay.outbox import OutboxEvent
from relay.wiring import message_builder
from tests.interop.all_types import (
    TOKEN,
    UID,
    all_types_documents,
    change_for,
    generic_payload,
    registry_with_all_types,
)

COMMON = ("id", "aggregateType", "aggregateId", "eventType")


def test_spark_from_avro_decodes_every_writer_schema_and_selects_the_common_columns(spark):
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    registry = registry_with_all_types()
    builder = message_builder(Settings(), registry)
    events = [OutboxEvent.new("order", f"all-{i}", "AllTypes", payload) for i, (payload, _) in enumerate(
        all_types_documents())]
    events += [OutboxEvent.new("order", "g", "NoSchema", generic_payload()),
               OutboxEvent.new("order", "t", "OrderCreated", {"orderId": "o-1", "amount": 12.5, "step": 1})]
    values = [builder.build(change_for(e.to_document()), 1).value for e in events]
    kafka = spark.createDataFrame([(bytearray(v),) for v in values], "value binary")

    def decoded(schema_name: str, frame: Any) -> Any:
        return frame.select(from_avro(F.expr("substring(value, 11, length(value) - 10)"),
                                      json.dumps(registry.raw(schema_name)),
                                      {"mode": "FAILFAST"}).alias("e"))

    rows: dict[str, Any] = {}
    for f in registry.files:
        if f.historical:
            continue
        part = decoded(f.name, kafka.where(F.substring("value", 3, 8) == F.lit(bytearray(f.fingerprint))))
        payload = F.col("e.payload") if f.name == "io.outboxrelay.v1.OutboxEvent" else F.to_json("e.payload")
        common = part.select(*[F.col(f"e.{c}") for c in COMMON],
                             F.expr("unix_micros(e.occurredAt)").alias("occurredAtMicros"),
                             F.col("e.source.position"), payload.alias("payload"))
        for row in common.collect():
            rows[row["id"]] = (f.name, row)
    assert len(rows) == len(events)
    for event in events:
        name, row = rows[event.id_str]
        assert [row[c] for c in COMMON] == [event.id_str, "order", event.aggregate_id, event.event_type]
        assert row["occurredAtMicros"] == (event.occurred_at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) \
            // dt.timedelta(microseconds=1)
        assert row["position"] == TOKEN["_data"]
        if event.event_type == "NoSchema":
            assert name == "io.outboxrelay.v1.OutboxEvent" and row["payload"].startswith('{"oid": {"$oid": ')
        elif event.event_type == "OrderCreated":
            assert name == "io.outboxrelay.v1.events.OrderCreated"
            assert json.loads(row["payload"]) == {"orderId": "o-1", "amount": 12.5, "step": 1}
        else:
            assert name == "io.outboxrelay.test.events.AllTypes"

    # The typed payload's Spark values (timestamps as micros: PySpark's collect() converts
    # timestamps to local-time datetimes, which cannot hold year 1).
    all_types = decoded("io.outboxrelay.test.events.AllTypes", kafka.where(
        F.substring("value", 3, 8) == F.lit(bytearray(registry.fingerprint("io.outboxrelay.test.events.AllTypes")))))
    got = {r["id"]: r for r in all_types.select(
        "e.id", "e.payload.amount", "e.payload.smallest", "e.payload.largest", "e.payload.uuid",
        "e.payload.objectIdBytes", "e.payload.birthday", "e.payload.lines", "e.payload.choice",
        "e.payload.attributes", "e.payload.ratio", "e.payload.price",
        F.expr("unix_micros(e.payload.createdAt)").alias("createdAt"),
        F.expr("unix_micros(e.payload.preciseAt)").alias("preciseAt")).collect()}
    first, second = got[events[0].id_str], got[events[1].id_str]
    assert first["amount"] == Decimal("-9999999999999999999999999999.9999") and second["price"] == Decimal("7.00")
    assert first["smallest"] == -(2**63) and first["largest"] == 2**63 - 1
    assert first["uuid"] == str(UID) and bytes(first["objectIdBytes"]) == bytes.fromhex("65f0c0ffee0000000000abcd")
    assert first["birthday"] == dt.date(1912, 6, 23) and first["lines"][1]["price"] == Decimal("9999999.99")
    assert first["choice"].asDict() == {"member0": -1, "member1": None}  # Spark's struct for a union
    assert second["choice"].asDict() == {"member0": None, "member1": "text"}
    assert first["attributes"] == {"a.b": "dotted", "": "empty key"}
    assert str(first["ratio"]) == "-0.0" and second["ratio"] != second["ratio"]  # -0.0 and NaN survive
    assert first["createdAt"] == -14182939877000 and first["preciseAt"] == -62135596800000000
    assert second["preciseAt"] == -1000

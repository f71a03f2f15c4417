"""Decoding: the registry's schemas, the fingerprints, typed and generic payloads, unknown ones."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from importlib import resources

import pytest

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.spark.decode import decode_events, topic_pattern
from relay.spark.schemas import writer_schemas

KAFKA_ROW = ("value binary, topic string, partition int, offset long, timestamp timestamp, key binary, "
             "headers array<struct<key:string,value:binary>>")
SOURCE = {"database": "app", "collection": "outbox", "clusterTime": 42, "position": "8200AB"}
TYPED = {
    "type": "record", "name": "OrderPlaced", "namespace": "io.outboxrelay.v1.order", "eventType": "OrderPlaced",
    "fields": [
        {"name": "id", "type": "string"}, {"name": "aggregateType", "type": "string"},
        {"name": "aggregateId", "type": "string"}, {"name": "eventType", "type": "string"},
        {"name": "occurredAt", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "payload", "type": {"type": "record", "name": "OrderPlacedPayload", "fields": [
            {"name": "orderId", "type": "string"}, {"name": "amount", "type": "double"},
            {"name": "lines", "type": {"type": "array", "items": "string"}}]}},
        {"name": "source", "type": {"type": "record", "name": "SourcePosition", "namespace": "io.outboxrelay.v1", "fields": [
            {"name": "database", "type": "string"}, {"name": "collection", "type": "string"},
            {"name": "clusterTime", "type": "long"}, {"name": "position", "type": "string"}]}},
    ],
}


@pytest.fixture
def registry_folder(tmp_path):
    """The bundled schemas plus a typed envelope of our own under events/, as a registry folder."""
    folder = tmp_path / "schemas"
    with resources.as_file(resources.files("relay_schemas")) as bundled:
        shutil.copytree(bundled, folder, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    (folder / "events").mkdir(exist_ok=True)
    (folder / "events" / "OrderPlaced.avsc").write_text(json.dumps(TYPED))
    return folder


def test_fingerprints_and_names_match_the_relays_registry():
    relay_registry = SchemaFolder.bundled()
    schemas = writer_schemas()
    fingerprints = {s.fingerprint for s in schemas}
    assert ENVELOPE in {s.name for s in schemas}
    for s in schemas:  # the relay writes each current schema under the fingerprint we decode
        assert relay_registry.fingerprint(s.name) in fingerprints
    generic = next(s for s in schemas if s.name == ENVELOPE)
    assert generic.payload_is_text and generic.fingerprint == relay_registry.fingerprint(ENVELOPE)


def test_topic_pattern_matches_exactly_the_topics_the_template_produces():
    pattern = re.compile(topic_pattern("outbox.event.{aggregateType}"))
    assert pattern.fullmatch("outbox.event.order") and pattern.fullmatch("outbox.event.customer-v2")
    assert not pattern.fullmatch("outboxXevent.order") and not pattern.fullmatch("outbox.event.")
    assert re.compile(topic_pattern("t1.{aggregateType}.{eventType}")).fullmatch("t1.order.Created")


def test_generic_and_typed_events_decode_to_the_common_columns_with_json_payloads(spark, registry_folder):
    registry = SchemaFolder(registry_folder)
    when = dt.datetime(2025, 3, 4, 5, 6, 7, 891000, tzinfo=dt.UTC)
    common = {"aggregateType": "order", "aggregateId": "o-1", "occurredAt": when, "source": SOURCE}
    generic = registry.encode(ENVELOPE, {**common, "id": "e1", "eventType": "OrderCreated",
                                         "payload": '{"amount": 12.5}'})
    typed = registry.encode("io.outboxrelay.v1.order.OrderPlaced", {
        **common, "id": "e2", "eventType": "OrderPlaced",
        "payload": {"orderId": "o-1", "amount": 12.5, "lines": ["a", "b"]}})
    headers = [("ce_id", b"x"), ("relay_fencing_token", b"7")]
    rows = [(generic, "t", 0, 0, when, b"o-1", headers), (typed, "t", 0, 1, when, b"o-1", [])]
    decoded = decode_events(spark.createDataFrame(rows, KAFKA_ROW), writer_schemas(registry_folder))
    got = {r["id"]: r for r in decoded.collect()}
    assert got["e1"]["payload"] == '{"amount": 12.5}'
    assert json.loads(got["e2"]["payload"]) == {"orderId": "o-1", "amount": 12.5, "lines": ["a", "b"]}
    assert got["e2"]["writerSchema"] == "io.outboxrelay.v1.order.OrderPlaced"
    assert got["e1"]["writerSchema"] == ENVELOPE
    for r in got.values():
        assert (r["aggregateType"], r["aggregateId"], r["key"]) == ("order", "o-1", "o-1")
        assert r["source"].asDict() == SOURCE
        assert r["occurredAt"].replace(tzinfo=None) == when.astimezone().replace(tzinfo=None)
        assert r["decodeError"] is None
    assert got["e1"]["fencingToken"] == 7 and got["e2"]["fencingToken"] is None


def test_an_unknown_writer_schema_fails_the_decoding_naming_the_message(spark):
    unknown = b"\xc3\x01" + bytes.fromhex("0102030405060708") + b"\x00"
    df = spark.createDataFrame([(unknown, "orders", 2, 17, dt.datetime(2025, 1, 1), b"k", [])], KAFKA_ROW)
    with pytest.raises(Exception, match=r"undecodable message orders\[2\]@17: no writer schema for "
                                        r"fingerprint 0102030405060708"):
        decode_events(df, writer_schemas()).collect()
    lenient = decode_events(df, writer_schemas(), strict=False).collect()
    assert lenient[0]["id"] is None and "0102030405060708" in lenient[0]["decodeError"]

"""Interop: messages the relay writes, decoded by an independent implementation, the Apache Avro
Java library (`BinaryMessageDecoder` + `SchemaStore`), equal to what was written.

- Through the real path: outbox documents holding every BSON type are inserted into a real
  MongoDB replica set, published by the relay to a real Kafka broker, read back from the topic,
  and decoded in Java.
- Arbitrary payloads: hypothesis generates payload schemas (every mapping, nested) and payloads;
  the relay's message builder encodes them; Java decodes the whole batch in one run.
- Schema evolution: a value written with a schema kept in `history/` is resolved by Java to the
  current schema through the store.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import shutil
import uuid
from pathlib import Path

import fastavro
import pytest
from bson import json_util
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from hypothesis import HealthCheck, given, settings

from relay.avro.contract import ENVELOPE, SchemaFile, history_file_name, parse_file
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.outbox import Outbox, OutboxEvent
from relay.wiring import message_builder
from tests.interop.all_types import (
    ALL_TYPES,
    all_types_documents,
    change_for,
    generic_payload,
    registry_with_all_types,
)
from tests.interop.avro_java import JavaDecoder
from tests.interop.bson_cases import (
    Case,
    expected_envelope,
    n_double,
    n_ts,
    normalize_java,
    normalize_python,
    same_bson,
    typed_cases,
)
from tests.support.relays import RelayThread
from tests.support.topics import topic_size
from tests.support.waiting import wait_until

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE.parent.parent / "schemas"
READERS = [SCHEMAS / "outbox_event.avsc", SCHEMAS / "events" / "OrderCreated.avsc", ALL_TYPES]
UTC = dt.UTC


@pytest.fixture(scope="module")
def java() -> JavaDecoder:
    return JavaDecoder.get()


# ---- every BSON type, through MongoDB, the relay and Kafka ---------------------------------------

def read_values(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, dict[str, bytes]]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"interop-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[tuple[bytes, dict[str, bytes]]] = []
        for _ in range(240):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append((msg.value(), dict(msg.headers() or [])))
            if len(out) >= count:
                break
        return out
    finally:
        consumer.close()


def test_java_decodes_every_bson_type_the_relay_published_through_kafka(env, java):
    registry = registry_with_all_types()
    cases = all_types_documents()
    outbox = Outbox(env.outbox)
    events = [OutboxEvent.new("order", f"all-{i}", "AllTypes", payload,
                              occurred_at=dt.datetime(1965, 3, 4, 5, 6, 7, 890000, UTC) if i else
                              dt.datetime(2026, 1, 2, 3, 4, 5, 678000, UTC))
              for i, (payload, _) in enumerate(cases)]
    events.append(OutboxEvent.new("order", "generic", "NoSchema", generic_payload()))
    events.append(OutboxEvent.new("order", "typed", "OrderCreated", {"orderId": "o-1", "amount": 12.5, "step": 1}))
    with env.client.start_session() as session:
        session.with_transaction(lambda s: outbox.add_many(events, session=s))
    with RelayThread(env.settings, folder=registry) as runner:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= len(events), 60,
                   "the events in the topic")
    assert runner.error is None, runner.error
    messages = read_values(env.servers.kafka_bootstrap, env.topic(), len(events))
    assert len(messages) == len(events)
    decoded = java.decode([value for value, _ in messages], READERS)
    docs = {str(d["_id"]): d for d in env.outbox.find()}
    expected_payloads = {str(e.event_id): expected for e, (_, expected) in zip(events, cases)}
    for (value, headers), out in zip(messages, decoded):
        assert "error" not in out, out
        java_value = normalize_java(out["value"])
        event_id = java_value["id"]
        doc = docs[event_id]
        assert headers["ce_id"].decode() == event_id
        # What Python (fastavro) decodes from the same bytes: only the source position is not
        # known in advance (the change's resume token).
        python_value = normalize_python(registry.decode(value))
        source = python_value["source"]
        assert source["database"] == env.settings.database and source["position"]
        if doc["eventType"] == "AllTypes":
            assert out["writer"] == "io.outboxrelay.test.events.AllTypes"
            payload = expected_payloads[event_id]
        elif doc["eventType"] == "OrderCreated":
            assert out["writer"] == "io.outboxrelay.v1.events.OrderCreated"
            payload = {"orderId": "o-1", "amount": n_double(12.5), "step": 1}
        else:
            assert out["writer"] == ENVELOPE
            payload = json_util.dumps(doc["payload"], json_options=json_util.RELAXED_JSON_OPTIONS)
            assert same_bson(json_util.loads(java_value["payload"], json_options=json_util.JSONOptions(
                tz_aware=True)), generic_payload())
        expected = expected_envelope(doc, payload, source["position"], source["clusterTime"],
                                     env.settings.database, env.settings.outbox_collection)
        assert java_value == expected
        assert python_value == expected


# ---- arbitrary typed payloads ------------------------------------------------------------------

def test_java_decodes_arbitrary_typed_payloads_equal_to_what_was_written(java, tmp_path):
    generic = json.loads((SCHEMAS / "outbox_event.avsc").read_text())
    cases: list[Case] = []

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(typed_cases())
    def collect(case: Case) -> None:
        cases.append(case)

    collect()
    readers, values, expected = [SCHEMAS / "outbox_event.avsc"], [], []
    for i, case in enumerate(cases):
        envelope = case.envelope(f"Case{i}", f"Case{i}", generic)
        path = tmp_path / f"Case{i}.avsc"
        path.write_text(json.dumps(envelope))
        readers.append(path)
        registry = SchemaFolder.bundled()
        registry.add(envelope)
        doc = OutboxEvent.new("order", f"a{i}", f"Case{i}", case.payload).to_document()
        values.append(message_builder(Settings(), registry).build(change_for(doc), 1).value)
        expected.append((f"io.outboxrelay.test.Case{i}", case))
    decoded = java.decode(values, readers)
    for out, (name, case) in zip(decoded, expected):
        assert "error" not in out, (out, json.dumps(case.payload_schema))
        assert out["writer"] == name
        assert normalize_java(out["value"]["payload"]) == case.expected, json.dumps(case.payload_schema)


# ---- schema evolution: history ------------------------------------------------------------------

def test_java_resolves_a_value_written_with_a_historical_schema_to_the_current_one(java, tmp_path):
    old = json.loads((SCHEMAS / "events" / "OrderCreated.avsc").read_text())
    new = json.loads(json.dumps(old))
    payload = next(f for f in new["fields"] if f["name"] == "payload")["type"]
    payload["fields"].append({"name": "couponCode", "type": ["null", "string"], "default": None})
    folder = tmp_path / "schemas"
    (folder / "events").mkdir(parents=True)
    (folder / "history").mkdir()
    shutil.copy(SCHEMAS / "outbox_event.avsc", folder)
    (folder / "events" / "OrderCreated.avsc").write_text(json.dumps(new))
    old_file: SchemaFile = parse_file("history/x.avsc", json.dumps(old))
    history = folder / history_file_name(old_file)
    history.write_text(json.dumps(old))
    registry = SchemaFolder(folder)

    record = {"id": "e1", "aggregateType": "order", "aggregateId": "o-1", "eventType": "OrderCreated",
              "occurredAt": dt.datetime(1960, 1, 1, tzinfo=UTC),
              "payload": {"orderId": "o-1", "amount": 3.25, "step": 1},
              "source": {"database": "app", "collection": "outbox", "clusterTime": 1, "position": "82"}}
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + old_file.fingerprint)
    fastavro.schemaless_writer(buf, old_file.parsed, record)
    value = buf.getvalue()
    assert registry.decode_named(value)[0] == "io.outboxrelay.v1.events.OrderCreated"  # found in history/
    out, = java.decode([value], [folder / "outbox_event.avsc", folder / "events" / "OrderCreated.avsc"], [history])
    assert "error" not in out, out
    assert out["value"]["payload"] == {"orderId": "o-1", "amount": {"$double": "3.25"}, "step": 1, "couponCode": None}
    assert normalize_java(out["value"]["occurredAt"]) == n_ts(record["occurredAt"])


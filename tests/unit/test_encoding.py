"""Avro single-object encoding, typed and generic envelopes, message building (pure logic)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from bson import ObjectId
from fastavro.schema import fingerprint, to_parsing_canonical_form

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.change import Change
from relay.core.errors import PoisonEventError
from relay.core.message import HEADER_FENCING
from relay.outbox import OutboxEvent
from relay.wiring import message_builder
from tests.changes import change_value

REGISTRY = SchemaFolder.bundled()
REGISTRY_DIR = Path(__file__).resolve().parents[2] / "schemas"
TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}


def change_for(doc: dict) -> Change:
    return change_value(doc, TOKEN)


def test_single_object_header_is_c301_and_the_little_endian_crc64_fingerprint():
    schema = REGISTRY.schema(ENVELOPE)
    expected = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    value = message_builder(Settings(), REGISTRY).build(change_for(
        OutboxEvent.new("order", "o1", "Created", {"a": 1}).to_document()), 3).value
    assert value[:2] == b"\xc3\x01" and value[2:10] == expected


def test_message_round_trips_and_carries_cloudevents_headers():
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    event = OutboxEvent.new("order", "o-9", "OrderPaid", {"amount": 12.5, "id": ObjectId("6b0220000000000000000001")},
                            occurred_at=when, headers={"traceparent": "00-abc"})
    msg = message_builder(Settings(), REGISTRY).build(change_for(event.to_document()), 7)
    assert msg.topic == "outbox.event.order" and msg.key == b"o-9"
    decoded = REGISTRY.decode(msg.value)
    assert decoded["id"] == event.id_str and decoded["occurredAt"] == when
    assert decoded["payload"] == '{"amount": 12.5, "id": {"$oid": "6b0220000000000000000001"}}'
    assert decoded["source"]["position"] == TOKEN["_data"]
    assert decoded["source"]["clusterTime"] == (0x6B02209A << 32) | 1
    headers = dict(msg.headers)
    assert headers["ce_id"] == event.id_str.encode() and headers["ce_type"] == b"OrderPaid"
    assert headers["ce_time"] == b"2026-01-02T03:04:05.678Z" and headers["ce_subject"] == b"o-9"
    assert headers["ce_source"] == b"/outbox-relay/app/outbox" and headers["ce_specversion"] == b"1.0"
    assert headers[HEADER_FENCING] == b"7" and headers["traceparent"] == b"00-abc"


def test_topic_field_overrides_the_template():
    doc = OutboxEvent.new("order", "o1", "Created", {}, topic="custom.topic").to_document()
    assert message_builder(Settings(), REGISTRY).build(change_for(doc), 1).topic == "custom.topic"


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.pop("eventType"), "field 'eventType' is missing"),
    (lambda d: d.update(aggregateId=None), "field 'aggregateId' is null"),
    (lambda d: d.update(payload=None), "field 'payload' is null"),
    (lambda d: d.pop("occurredAt"), "field 'occurredAt' is missing"),
    (lambda d: d.update(aggregateId=42), "field 'aggregateId' must be a non-empty string"),
    (lambda d: d.update(headers={"ce_id": "x"}), "reserves"),
    (lambda d: d.update(headers={"n": 1}), "field 'headers.n' must be a string"),
    (lambda d: d.update(aggregateType="has space"), "invalid Kafka topic name"),
])
def test_malformed_documents_are_poison_naming_event_and_field(mutate, fragment):
    doc = OutboxEvent.new("order", "o1", "Created", {}).to_document()
    mutate(doc)
    with pytest.raises(PoisonEventError) as err:
        message_builder(Settings(), REGISTRY).build(change_for(doc), 1)
    assert err.value.event_id == str(doc["_id"]) and fragment in str(err.value)


def test_event_larger_than_message_max_bytes_is_poison():
    settings = Settings.load(env={"RELAY_KAFKA_MESSAGE_MAX_BYTES": "5000"})
    doc = OutboxEvent.new("order", "o1", "Created", {"blob": "x" * 6000}).to_document()
    with pytest.raises(PoisonEventError, match="exceeds message.max.bytes"):
        message_builder(settings, REGISTRY).build(change_for(doc), 1)


def test_decode_rejects_unknown_fingerprints_and_foreign_bytes():
    with pytest.raises(ValueError, match="single-object"):
        REGISTRY.decode(b"{}")
    with pytest.raises(ValueError, match="unknown writer schema"):
        REGISTRY.decode(b"\xc3\x01" + b"\x00" * 8 + b"\x00")


# ---- typed envelopes ----------------------------------------------------------------------------

def test_event_types_with_a_schema_use_their_typed_envelope_and_others_the_generic_one():
    typed = message_builder(Settings(), REGISTRY).build(change_for(OutboxEvent.new(
        "order", "o1", "OrderCreated", {"orderId": "o1", "amount": 12.5, "step": 1}).to_document()), 1)
    name, record = REGISTRY.decode_named(typed.value)
    assert name == "io.outboxrelay.v1.events.OrderCreated"
    assert record["payload"] == {"orderId": "o1", "amount": 12.5, "step": 1}
    assert typed.value[2:10] == REGISTRY.fingerprint(name)
    plain = message_builder(Settings(), REGISTRY).build(change_for(OutboxEvent.new(
        "order", "o1", "OrderShipped", {"n": 1}).to_document()), 1)
    assert REGISTRY.decode_named(plain.value) == (ENVELOPE, REGISTRY.decode(plain.value))
    assert REGISTRY.decode(plain.value)["payload"] == '{"n": 1}'


def test_typed_and_generic_envelopes_share_every_top_level_field_but_payload():
    generic = REGISTRY.schema(ENVELOPE)["fields"]
    typed = REGISTRY.schema("io.outboxrelay.v1.events.OrderCreated")["fields"]
    assert [f["name"] for f in typed] == [f["name"] for f in generic]
    for g, t in zip(generic, typed):
        if g["name"] != "payload":
            assert to_parsing_canonical_form(g["type"]) == to_parsing_canonical_form(t["type"])


def test_a_typed_payload_that_does_not_fit_its_schema_is_poison_naming_the_field_path():
    doc = OutboxEvent.new("order", "o1", "OrderCreated", {"orderId": "o1", "amount": "12.50", "step": 1}).to_document()
    with pytest.raises(PoisonEventError) as err:
        message_builder(Settings(), REGISTRY).build(change_for(doc), 1)
    assert err.value.event_id == str(doc["_id"])
    assert "field 'payload.amount' holds string, which does not map to Avro double" in str(err.value)
    assert "schemas/events/OrderCreated.avsc" in str(err.value)


def test_dates_outside_years_1_to_9999_stay_in_the_generic_payload_as_extended_json():
    from bson.datetime_ms import DatetimeMS

    doc = OutboxEvent.new("order", "o1", "Created", {"far": DatetimeMS(2**50), "pre": dt.datetime(
        1969, 7, 20, 20, 17, 40, tzinfo=dt.UTC)}).to_document()
    payload = REGISTRY.decode(message_builder(Settings(), REGISTRY).build(change_for(doc), 1).value)["payload"]
    assert payload == '{"far": {"$date": {"$numberLong": "1125899906842624"}}, ' \
                      '"pre": {"$date": {"$numberLong": "-14182940000"}}}'


def test_a_schema_folder_breaking_the_envelope_rules_is_refused_naming_the_file(tmp_path):
    import json
    import shutil

    from relay.avro.contract import SchemaError

    shutil.copy(Path(REGISTRY_DIR, "outbox_event.avsc"), tmp_path)
    (tmp_path / "events").mkdir()
    typed = json.loads(Path(REGISTRY_DIR, "events", "OrderCreated.avsc").read_text())
    typed["fields"] = [f for f in typed["fields"] if f["name"] != "source"]
    (tmp_path / "events" / "OrderCreated.avsc").write_text(json.dumps(typed))
    with pytest.raises(SchemaError) as err:
        SchemaFolder(tmp_path)
    assert err.value.file == "events/OrderCreated.avsc" and "fields must be those of" in str(err.value)

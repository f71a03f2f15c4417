"""Property tests (hypothesis): arbitrary payloads survive encode -> decode through the relay's
message builder, for the generic envelope (Extended JSON text) and for typed envelopes (random
payload schemas covering every BSON -> Avro mapping, nested)."""

from __future__ import annotations

import json

from bson import json_util
from bson.codec_options import DatetimeConversion
from bson.json_util import JSONMode, JSONOptions
from hypothesis import HealthCheck, given, settings

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.change import Change
from relay.outbox import OutboxEvent
from relay.wiring import message_builder
from tests.changes import change_value
from tests.interop.bson_cases import (
    Case,
    bson_documents,
    normalize_python,
    same_bson,
    typed_cases,
)

BUNDLED = SchemaFolder.bundled()
GENERIC = dict(BUNDLED.raw(ENVELOPE))
TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}
READ_BACK = JSONOptions(json_mode=JSONMode.RELAXED, tz_aware=True,
                        datetime_conversion=DatetimeConversion.DATETIME_AUTO)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def change_for(doc: dict) -> Change:
    return change_value(doc, TOKEN)


def registry_with(case: Case, event_type: str = "PropertyEvent") -> SchemaFolder:
    registry = SchemaFolder.bundled()
    registry.add(case.envelope("PropertyEvent", event_type, GENERIC))
    return registry


@PROPERTY
@given(bson_documents())
def test_generic_envelope_round_trips_any_bson_payload_as_relaxed_extended_json(payload):
    doc = OutboxEvent.new("order", "o1", "NoSchemaForThis", payload).to_document()
    value = message_builder(Settings(), BUNDLED).build(change_for(doc), 1).value
    name, record = BUNDLED.decode_named(value)
    assert name == ENVELOPE
    assert record["payload"] == json_util.dumps(doc["payload"], json_options=json_util.RELAXED_JSON_OPTIONS)
    assert same_bson(json_util.loads(record["payload"], json_options=READ_BACK), payload)


@PROPERTY
@given(typed_cases())
def test_typed_envelope_round_trips_any_payload_that_fits_its_schema(case):
    registry = registry_with(case)
    doc = OutboxEvent.new("order", "o1", "PropertyEvent", case.payload).to_document()
    builder = message_builder(Settings(), registry)
    value = builder.build(change_for(doc), 1).value
    name, record = registry.decode_named(value)
    assert name == "io.outboxrelay.test.PropertyEvent"
    assert normalize_python(record["payload"]) == case.expected, json.dumps(case.payload_schema)
    # Deterministic: the same event gives the same bytes.
    assert builder.build(change_for(doc), 1).value == value


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_cases(max_leaves=6))
def test_every_generated_payload_schema_is_a_valid_typed_envelope(case):
    registry = registry_with(case)
    assert registry.writer_for("PropertyEvent").name == "io.outboxrelay.test.PropertyEvent"
    assert registry.writer_for("Other").name == ENVELOPE

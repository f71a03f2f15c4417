"""Framing: single-object encoding vs the Confluent wire format. The fast layer: the Confluent
path is exercised against confluent-kafka's own mock registry client (`mock://` URLs), which
registers and serves schemas in memory as a registry would; tests/integration/test_schema_registry.py
runs it against a real registry server."""

from __future__ import annotations

import json
import uuid

import pytest

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.avro.framing import (
    ConfluentFraming,
    MessageDecoder,
    SingleObjectFraming,
    framing_for,
    registry_client,
)
from relay.avro.wire import CONFLUENT, SINGLE_OBJECT
from relay.config import Settings
from relay.core.change import Change
from relay.core.errors import (
    ConfigError,
    SchemaRegistryRefusedError,
    SchemaRegistryUnavailableError,
    TransientError,
)
from relay.core.errors import (
    OperatorActionError as StopError,
)
from relay.outbox import OutboxEvent
from relay.wiring import message_builder
from tests.changes import change_value

REGISTRY = SchemaFolder.bundled()
TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}
TYPED = "io.outboxrelay.v1.events.OrderCreated"


def change_for(doc: dict) -> Change:
    return change_value(doc, TOKEN)


def mock_settings(**kw: str) -> Settings:
    return Settings.load(env={"RELAY_SCHEMA_REGISTRY_URL": f"mock://{uuid.uuid4().hex}", **kw})


def order_created() -> dict:
    return OutboxEvent.new("order", "o-1", "OrderCreated", {"orderId": "o-1", "amount": 9.5, "step": 1}).to_document()


def generic() -> dict:
    return OutboxEvent.new("order", "o-1", "OrderPaid", {"amount": 9.5}).to_document()


def test_without_a_registry_url_values_use_single_object_encoding():
    assert isinstance(framing_for(Settings().parts().registry, REGISTRY), SingleObjectFraming)
    value = message_builder(Settings(), REGISTRY).build(change_for(generic()), 1).value
    assert value[:2] == b"\xc3\x01" and value[2:10] == REGISTRY.fingerprint(ENVELOPE)


def test_with_a_registry_url_values_use_the_confluent_wire_format_with_the_registered_id():
    settings = mock_settings()
    builder = message_builder(settings, REGISTRY)
    typed = builder.build(change_for(order_created()), 1)
    plain = builder.build(change_for(generic()), 1)
    client = registry_client(settings.schema_registry_url)
    for msg, name in ((typed, TYPED), (plain, ENVELOPE)):
        assert msg.value[0] == 0
        schema_id = int.from_bytes(msg.value[1:5], "big")
        registered = client.get_latest_version(f"outbox.event.order-{name}")  # topic-record, the default
        assert registered.schema_id == schema_id
        decoded = MessageDecoder(REGISTRY, client).decode(msg.value, msg.topic)
        assert (decoded.framing, decoded.schema, decoded.schema_ref) == (CONFLUENT, name, str(schema_id))
    assert MessageDecoder(REGISTRY, client).decode(typed.value).record["payload"] == {
        "orderId": "o-1", "amount": 9.5, "step": 1}


def test_both_framings_carry_the_same_avro_body():
    single = message_builder(Settings(), REGISTRY).build(change_for(doc := order_created()), 1).value
    confluent = message_builder(mock_settings(), REGISTRY).build(change_for(doc), 1).value
    assert single[10:] == confluent[5:]


@pytest.mark.parametrize("strategy, subject", [
    ("topic", "outbox.event.order-value"),
    ("record", TYPED),
    ("topic-record", f"outbox.event.order-{TYPED}"),
])
def test_the_subject_naming_strategy_is_configurable(strategy, subject):
    settings = mock_settings(RELAY_SCHEMA_REGISTRY_SUBJECT_STRATEGY=strategy)
    message_builder(settings, REGISTRY).build(change_for(order_created()), 1)
    assert registry_client(settings.schema_registry_url).get_subjects() == [subject]


def test_with_auto_registration_off_an_unregistered_schema_stops_the_relay_naming_the_subject():
    settings = mock_settings(RELAY_SCHEMA_REGISTRY_AUTO_REGISTER="false")
    with pytest.raises(SchemaRegistryRefusedError) as err:
        message_builder(settings, REGISTRY).build(change_for(order_created()), 1)
    assert isinstance(err.value, StopError) and f"outbox.event.order-{TYPED}" in str(err.value)


def test_with_auto_registration_off_a_pre_registered_schema_is_used():
    from confluent_kafka.schema_registry import Schema

    settings = mock_settings(RELAY_SCHEMA_REGISTRY_AUTO_REGISTER="false")
    client = registry_client(settings.schema_registry_url)
    schema_id = client.register_schema(f"outbox.event.order-{ENVELOPE}", Schema(json.dumps(REGISTRY.raw(ENVELOPE)), "AVRO"))
    value = message_builder(settings, REGISTRY).build(change_for(generic()), 1).value
    assert int.from_bytes(value[1:5], "big") == schema_id


def test_registry_errors_are_classified_transient_or_stop():
    from confluent_kafka.schema_registry import SchemaRegistryError

    class Failing:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def register_schema_full_response(self, *a, **kw):
            raise self.exc

        def config(self):
            return {"url": "http://registry:8081"}

    cases = [(SchemaRegistryError(503, 50301, "unavailable"), SchemaRegistryUnavailableError),
             (ConnectionError("refused"), SchemaRegistryUnavailableError),
             (SchemaRegistryError(409, 409, "incompatible"), SchemaRegistryRefusedError),
             (SchemaRegistryError(401, 401, "unauthorized"), SchemaRegistryRefusedError)]
    for exc, kind in cases:
        framing = ConfluentFraming(REGISTRY, Failing(exc))  # type: ignore[arg-type]
        with pytest.raises(kind):
            message_builder(Settings(), REGISTRY, framing=framing).build(change_for(generic()), 1)
    assert issubclass(SchemaRegistryUnavailableError, TransientError)


def test_decoder_names_unknown_or_foreign_values():
    decoder = MessageDecoder(REGISTRY)
    with pytest.raises(ValueError, match="no Schema Registry is configured"):
        decoder.decode(b"\x00\x00\x00\x00\x01\x02")
    with pytest.raises(ValueError, match="neither Avro single-object"):
        decoder.decode(b"{}")
    single = decoder.decode(message_builder(Settings(), REGISTRY).build(change_for(generic()), 1).value)
    assert (single.framing, single.schema) == (SINGLE_OBJECT, ENVELOPE)


@pytest.mark.parametrize("env, setting", [
    ({"RELAY_SCHEMA_REGISTRY_URL": "registry:8081"}, "RELAY_SCHEMA_REGISTRY_URL"),
    ({"RELAY_SCHEMA_REGISTRY_SUBJECT_STRATEGY": "by-topic"}, "RELAY_SCHEMA_REGISTRY_SUBJECT_STRATEGY"),
    ({"RELAY_SCHEMA_REGISTRY_AUTO_REGISTER": "yes"}, "RELAY_SCHEMA_REGISTRY_AUTO_REGISTER"),
    ({"RELAY_SCHEMA_REGISTRY_BASIC_AUTH": "no-colon"}, "RELAY_SCHEMA_REGISTRY_BASIC_AUTH"),
])
def test_invalid_registry_settings_name_the_setting(env, setting):
    with pytest.raises(ConfigError) as err:
        Settings.load(env=env)
    assert err.value.setting == setting

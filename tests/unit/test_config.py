"""Configuration parsing and validation (pure logic)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relay.config import Settings, markdown_table
from relay.core.config import start_at_time
from relay.core.errors import ConfigError
from relay.core.namespace import Namespace

README = Path(__file__).resolve().parents[2] / "README.md"


def test_defaults_are_the_documented_contract():
    s = Settings.load(env={})
    assert s.mongodb_uri == "mongodb://localhost:27017/?replicaSet=rs0"
    assert (s.database, s.outbox_collection) == ("app", "outbox")
    assert s.kafka_bootstrap_servers == "localhost:9092"
    assert s.topic_template == "outbox.event.{aggregateType}"
    assert s.start_at == "oplog-start"
    assert s.http_port == 8080
    assert s.parts().kafka.producer_config()["enable.idempotence"] == "true" and s.parts().kafka.producer_config()["acks"] == "all"


def test_environment_sets_fields_and_passes_kafka_properties_through():
    s = Settings.load(env={"RELAY_DATABASE": "shop", "RELAY_BATCH_MAX_EVENTS": "50",
                           "RELAY_KAFKA_COMPRESSION_TYPE": "zstd", "RELAY_KAFKA_LINGER_MS": "20"})
    assert s.database == "shop" and s.batch_max_events == 50
    assert s.parts().kafka.producer_config()["compression.type"] == "zstd"
    assert s.parts().kafka.producer_config()["linger.ms"] == "20"


def test_flags_win_over_environment_which_wins_over_the_file(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text('database = "from_file"\noutbox_collection = "events"\n[kafka]\n"linger.ms" = 7\n')
    s = Settings.load(env={"RELAY_CONFIG_FILE": str(path), "RELAY_DATABASE": "from_env"},
                      flags={"database": "from_flag"})
    assert s.database == "from_flag" and s.outbox_collection == "events"
    assert s.parts().kafka.producer_config()["linger.ms"] == "7"


@pytest.mark.parametrize("env, setting", [
    ({"RELAY_BATCH_MAX_EVENTS": "many"}, "RELAY_BATCH_MAX_EVENTS"),
    ({"RELAY_BATCH_MAX_EVENTS": "0"}, "RELAY_BATCH_MAX_EVENTS"),
    ({"RELAY_HTTP_PORT": "70000"}, "RELAY_HTTP_PORT"),
    ({"RELAY_START_AT": "yesterday"}, "RELAY_START_AT"),
    ({"RELAY_TOPIC_TEMPLATE": "events.{aggregate}"}, "RELAY_TOPIC_TEMPLATE"),
    ({"RELAY_MONGODB_URI": "localhost:27017"}, "RELAY_MONGODB_URI"),
    ({"RELAY_KAFKA_ACKS": "1"}, "RELAY_KAFKA_ACKS"),
    ({"RELAY_KAFKA_ENABLE_IDEMPOTENCE": "false"}, "RELAY_KAFKA_ENABLE_IDEMPOTENCE"),
    ({"RELAY_KAFKA_ENABLE_GAPLESS_GUARANTEE": "false"}, "RELAY_KAFKA_ENABLE_GAPLESS_GUARANTEE"),
    ({"RELAY_LEASE_TTL_S": "4", "RELAY_HEARTBEAT_INTERVAL_S": "3"}, "RELAY_HEARTBEAT_INTERVAL_S"),
    ({"RELAY_DATABSE": "typo"}, "RELAY_DATABSE"),
    ({"RELAY_LOG_LEVEL": "loud"}, "RELAY_LOG_LEVEL"),
    ({"RELAY_READ_LINGER_MS": "-1"}, "RELAY_READ_LINGER_MS"),
])
def test_invalid_configuration_names_the_setting(env, setting):
    with pytest.raises(ConfigError) as err:
        Settings.load(env=env).parts()
    assert err.value.setting == setting
    assert str(err.value).startswith(setting)


@pytest.mark.parametrize("env, meant", [
    ({"RELAY_OUTBOXS": "shop.outbox"}, "RELAY_OUTBOXES"),
    ({"RELAY_DATABSE": "shop"}, "RELAY_DATABASE"),
    ({"RELAY_BATCH_MAX_EVENT": "5"}, "RELAY_BATCH_MAX_EVENTS"),
])
def test_a_misspelled_setting_is_refused_in_one_short_line_naming_the_one_meant(env, meant):
    with pytest.raises(ConfigError) as err:
        Settings.load(env=env)
    text = str(err.value)
    (key,) = env
    assert text == f"{key}: unknown setting; did you mean {meant}?"
    assert "\n" not in text and "known:" not in text


def test_a_setting_like_no_other_is_refused_without_a_guess():
    with pytest.raises(ConfigError) as err:
        Settings.load(env={"RELAY_ZZZZZZZZZZZZ": "1"})
    assert str(err.value) == "RELAY_ZZZZZZZZZZZZ: unknown setting"


def test_a_misspelled_key_in_the_toml_file_is_refused_naming_the_key_meant(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text('outboxs = "shop.outbox"\n')
    with pytest.raises(ConfigError) as err:
        Settings.load(env={}, config_file=str(path))
    assert str(err.value) == f"{path}: outboxs: unknown setting; did you mean outboxes?"


def test_other_kafka_clients_get_the_security_properties_but_not_the_producer_ones():
    settings = Settings.load(env={"RELAY_KAFKA_BOOTSTRAP_SERVERS": "b:9093", "RELAY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                                  "RELAY_KAFKA_SASL_MECHANISM": "PLAIN", "RELAY_KAFKA_LINGER_MS": "20"})
    assert settings.kafka_client_config() == {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
                                              "sasl.mechanism": "PLAIN"}
    assert settings.parts().kafka.producer_config()["linger.ms"] == "20"


def test_acks_minus_one_is_accepted_as_all():
    assert Settings.load(env={"RELAY_KAFKA_ACKS": "-1"}).parts().kafka.producer_config()["acks"] == "all"


def test_start_at_accepts_an_iso_time():
    s = Settings.load(env={"RELAY_START_AT": "2026-01-02T03:04:05Z"})
    at = start_at_time(s.parts().loop.start_at)
    assert at is not None and at.isoformat() == "2026-01-02T03:04:05+00:00"


def test_readme_configuration_table_matches_the_settings_object():
    text = README.read_text()
    block = re.search(r"<!-- settings-table -->\n(.*?)\n<!-- /settings-table -->", text, re.S)
    assert block, "README.md lacks the generated settings table markers"
    assert block.group(1).strip() == markdown_table().strip(), (
        "README configuration table is stale: paste `python -c 'from relay.config import "
        "markdown_table; print(markdown_table())'` between the markers")


def test_each_setting_is_declared_once_and_reaches_its_parts_by_keyword():
    """A setting's default lives in Settings alone: no field of a part's configuration has a default
    of its own that a setting could contradict, and the value set is the value each part gets."""
    import dataclasses

    parts = Settings().parts()
    configs = [getattr(parts, f.name) for f in dataclasses.fields(parts) if f.name not in ("broker", "outboxes")]
    configs += [parts.observer.health, parts.loop.timing]
    own_defaults = {"batch", "pass_budget_s"}  # clean-up's internal pacing, not settings
    for config in configs:
        for f in dataclasses.fields(type(config)):
            if f.name not in own_defaults:
                assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, (config, f.name)
    changed = Settings(standby_poll_s=1.5, connect_timeout_s=7.0, field_payload="body").parts()
    assert changed.loop.timing is changed.group.timing is changed.observer.health.timing
    assert changed.loop.timing.standby_poll_s == 1.5
    assert changed.mongo.connect_timeout_s == changed.kafka.connect_timeout_s == changed.nats.connect_timeout_s == 7.0
    assert changed.encoding.fields.payload == "body"


def test_the_parts_are_built_once_per_settings_object():
    settings = Settings()
    assert settings.parts() is settings.parts()
    assert settings.replace(batch_max_events=5).parts().loop.max_in_flight_events == 5


def test_documented_variables_that_are_not_settings_are_accepted(tmp_path):
    """RELAY_CACHE_DIR (relay.cachedir; the pipeline image sets it), RELAY_CONFIG_FILE and the
    tests' RELAY_TEST_* variables are read elsewhere: `run` and `pipeline` must start with them."""
    path = tmp_path / "relay.toml"
    path.write_text('database = "from_file"\n')
    s = Settings.load(env={"RELAY_CACHE_DIR": "/opt/outbox-relay-cache", "RELAY_CONFIG_FILE": str(path),
                           "RELAY_TEST_DOCKER": "1", "RELAY_TEST_MONGODB_URI": "mongodb://x",
                           "RELAY_TEST_KAFKA_BOOTSTRAP": "x:9092"})
    assert s.database == "from_file"


def test_outboxes_the_template_routes_to_one_topic_are_found_from_the_settings_alone():
    from relay.avro.shared_topics import shared_topics

    def outboxes(*texts: str) -> list[Namespace]:
        return [Namespace.parse(t) for t in texts]

    default = "outbox.event.{aggregateType}"
    (shared,) = shared_topics(default, outboxes("shop.outbox", "billing.outbox"))
    assert shared.names == ["shop.outbox", "billing.outbox"] and shared.missing == "{database}"
    assert "shop.outbox and billing.outbox" in shared.warning() and "{database}" in shared.warning()
    assert shared_topics("outbox.{database}.{aggregateType}", outboxes("shop.outbox", "billing.outbox")) == []
    (same_db,) = shared_topics("outbox.{database}.{aggregateType}", outboxes("shop.a", "shop.b", "billing.a"))
    assert same_db.names == ["shop.a", "shop.b"] and same_db.missing == "{collection}"
    assert shared_topics(default, outboxes("shop.outbox")) == []

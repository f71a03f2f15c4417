"""Redaction: URIs show `user:***@`, password-like settings `***`, and the log formatters and the
command line mask the loaded credentials wherever they appear (relay.core.redact)."""

from __future__ import annotations

import datetime as dt
import json
import logging

import pytest

from relay.config import Settings
from relay.core.errors import ConfigError, ServerUnreachableError
from relay.core.redact import MASK, redact_mapping, redact_text, scrub, secret_name
from relay.mongo.privileges import Privilege, missing
from relay.ops.exits import run_command
from tests.support.logs import captured_logs

CANARY = "Canary-Pw-7c1e"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("mongodb://relayuser:S3cretPw@127.0.0.1:1/?replicaSet=rs0", "mongodb://relayuser:***@127.0.0.1:1/?replicaSet=rs0"),
        ("mongodb+srv://u:p%40ss@db.example/app", "mongodb+srv://u:***@db.example/app"),
        ("at mongodb://a:b@h1:1,h2:2/?tls=true&tlsCertificateKeyFilePassword=kp&w=1 now",
         "at mongodb://a:***@h1:1,h2:2/?tls=true&tlsCertificateKeyFilePassword=***&w=1 now"),
        ("http://reg:basic@registry:8081", "http://reg:***@registry:8081"),
        ("mongodb://127.0.0.1:1/?replicaSet=rs0", "mongodb://127.0.0.1:1/?replicaSet=rs0"),
        ("mongodb://onlyuser@h/", "mongodb://onlyuser:***@h/"),
    ],
)
def test_a_uri_shows_its_user_but_not_its_password(text: str, shown: str) -> None:
    assert redact_text(text) == shown


@pytest.mark.parametrize(
    "name",
    ["sasl.password", "sasl.username", "sasl.jaas.config", "sasl.oauthbearer.client.secret", "ssl.key.password",
     "ssl.keystore.password", "ssl.key.pem", "schema_registry_basic_auth", "basic.auth.user.info", "api_token",
     "RELAY_KAFKA_SSL_KEY_PASSWORD"],
)
def test_password_like_names_are_secret(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["sasl.mechanism", "sasl.mechanisms", "security.protocol", "ssl.ca.location", "fencing_token", "fencingToken",
     "token", "resumeToken", "mongodb_uri", "bootstrap.servers"],
)
def test_other_names_are_not(name: str) -> None:
    assert not secret_name(name)


def _loaded() -> Settings:
    return Settings.load(env={
        "RELAY_MONGODB_URI": f"mongodb://relayuser:{CANARY}1@127.0.0.1:1/?replicaSet=rs0",
        "RELAY_KAFKA_SASL_PASSWORD": f"{CANARY}2",
        "RELAY_KAFKA_SSL_KEY_PASSWORD": f"{CANARY}3",
        "RELAY_SCHEMA_REGISTRY_BASIC_AUTH": f"reg:{CANARY}4",
    })


def test_settings_render_credentials_masked() -> None:
    settings = _loaded()
    shown = settings.rendered()
    assert shown["mongodb_uri"] == "mongodb://relayuser:***@127.0.0.1:1/?replicaSet=rs0"
    assert shown["schema_registry_basic_auth"] == MASK
    assert shown["kafka"] == {"sasl.password": MASK, "ssl.key.password": MASK}
    assert CANARY not in repr(settings) and CANARY not in str(settings)
    assert redact_mapping({"nested": {"sasl.password": "x"}, "n": 3}) == {"nested": {"sasl.password": MASK}, "n": 3}


def _raise_chained() -> None:
    try:
        raise ValueError(f"driver says: bad password {CANARY}2 for mongodb://u:{CANARY}1@h/")
    except ValueError as exc:
        raise ServerUnreachableError(f"cannot reach with basic auth reg:{CANARY}4 ({CANARY}3)") from exc


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_the_log_formatter_masks_loaded_credentials_at_every_level_and_in_causes(fmt: str) -> None:
    _loaded()
    log = logging.getLogger("relay.test_redact")
    with captured_logs(fmt, "DEBUG") as capture:
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
            log.log(level, "connecting with %s", f"{CANARY}2", extra={"uri": f"mongodb://u:{CANARY}1@h/"})
        try:
            _raise_chained()
        except ServerUnreachableError:
            log.exception("stopping")
    assert capture.text.count("***") >= 8
    assert CANARY not in capture.text
    if fmt == "json":
        assert len(capture.lines()) == 5 and "ValueError" in capture.lines()[-1]["exc"]


def test_the_command_line_masks_loaded_credentials_in_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    _loaded()

    def refused() -> int:
        raise ConfigError("RELAY_KAFKA_SASL_PASSWORD", f"refused {CANARY}2")

    def crashed() -> int:
        raise RuntimeError(f"unexpected, with mongodb://u:{CANARY}1@h/ and reg:{CANARY}4")

    assert run_command("outbox-relay", refused) == 2
    assert run_command("outbox-relay", crashed) == 1
    err = capsys.readouterr().err
    assert "RuntimeError" in err and "Traceback" in err
    assert CANARY not in err
    assert scrub(f"x {CANARY}3 y") == "x *** y"


def test_the_privilege_check_reads_resources_as_mongodb_does() -> None:
    needed = [Privilege("app", "outbox", ("find", "changeStream"), ""), Privilege("local", "oplog.rs", ("find",), "")]
    assert missing([{"resource": {"anyResource": True}, "actions": ["anyAction"]}], needed) == []
    assert missing([], needed) == [("find", "app.outbox"), ("changeStream", "app.outbox"), ("find", "local.oplog.rs")]
    assert missing([{"resource": {"db": "", "collection": ""}, "actions": ["find", "changeStream"]}], needed) == []
    assert missing([{"resource": {"db": "app", "collection": ""}, "actions": ["find"]},
                    {"resource": {"cluster": True}, "actions": ["find"]}], needed) == [
        ("changeStream", "app.outbox"), ("find", "local.oplog.rs")]
    assert json.dumps(needed[0].document()) == (
        '{"resource": {"db": "app", "collection": "outbox"}, "actions": ["find", "changeStream"]}')


def test_an_unreachable_servers_error_names_the_uri_without_its_password() -> None:
    from relay.config import Settings
    from relay.dev.processes import free_port
    from relay.mongo.connection import check_mongodb, mongo_client

    uri = f"mongodb://relayuser:{CANARY}@127.0.0.1:{free_port()}/?replicaSet=rs0"
    config = Settings(mongodb_uri=uri, connect_timeout_s=0.3).parts().mongo
    with mongo_client(config) as client, pytest.raises(ServerUnreachableError) as refused:
        check_mongodb(client, config)
    assert "mongodb://relayuser:***@127.0.0.1:" in str(refused.value)
    assert CANARY not in str(refused.value)


def test_a_thread_that_crashes_is_logged_through_the_scrubbing_formatter() -> None:
    import threading

    _loaded()
    with captured_logs("json") as capture:
        def crash() -> None:
            raise RuntimeError(f"connect failed for mongodb://u:{CANARY}1@h/ with {CANARY}2")

        thread = threading.Thread(target=crash, name="reader")
        thread.start()
        thread.join()
    [line] = capture.lines()
    assert line["level"] == "ERROR" and line["message"] == "thread reader ended on RuntimeError"
    assert "RuntimeError: connect failed for mongodb://u:***@h/ with ***" in line["exc"]
    assert CANARY not in capture.text


# ---- values that render masked by construction -----------------------------------------------


def test_a_uri_secret_and_properties_render_masked_and_reveal_the_clear_value() -> None:
    from relay.core.redact import Properties, Secret, Uri

    uri = Uri(f"mongodb://relayuser:{CANARY}@h:1/?replicaSet=rs0")
    for shown in (str(uri), repr(uri), f"{uri}", f"{uri!r}", f"{[uri]}", json.dumps({"u": uri}, default=str)):
        assert CANARY not in shown and "relayuser:***@h:1" in shown, shown
    assert uri.reveal() == f"mongodb://relayuser:{CANARY}@h:1/?replicaSet=rs0"
    secret = Secret(f"reg:{CANARY}")
    assert (str(secret), repr(secret), f"{secret:>5}") == ("***", "'***'", "  ***")
    assert secret.reveal() == f"reg:{CANARY}" and not Secret("") and str(Secret("")) == ""
    props = Properties({"sasl.password": CANARY, "compression.type": "zstd"})
    assert CANARY not in repr(props) and CANARY not in str(props) and dict(props)["sasl.password"] == CANARY
    assert props == {"sasl.password": CANARY, "compression.type": "zstd"}
    with pytest.raises(TypeError):
        json.dumps({"u": uri})  # no encoder sees the clear value by accident


def test_every_part_configuration_renders_its_credentials_masked() -> None:
    from relay.spark.audit import AuditConfig
    from relay.spark.materialize import MaterializeConfig, MongoView
    from relay.spark.schemas import RegistryAccess

    settings = _loaded().replace(schema_registry_url="http://registry:8081")  # and basic auth
    parts = settings.parts()
    user_info = settings.replace(schema_registry_url=f"http://reg:{CANARY}5@registry:8081", schema_registry_basic_auth="")
    access = RegistryAccess.from_settings(settings)
    view = MongoView(settings.mongodb_uri, "app", "state")
    shown = [repr(parts), str(parts.mongo), repr(parts.kafka), repr(user_info.parts().registry), repr(access), repr(view),
             repr(MaterializeConfig(settings.kafka_bootstrap_servers, (), "t.*", "/o", "/c", view,
                                    kafka_client={"sasl.jaas.config": f'x password="{CANARY}6";'},
                                    schema_registry=access)),
             repr(AuditConfig(settings.mongodb_uri, "app", "outbox", parts.encoding.fields, "k:9092", (), None,
                              dt.datetime.now(dt.UTC), dt.datetime.now(dt.UTC), schema_registry=access))]
    assert not [s for s in shown if CANARY in s], shown
    assert "relayuser:***@" in shown[1] and "'sasl.password': '***'" in shown[2] and "reg:***@registry" in shown[3]
    assert "basic_auth='***'" in repr(parts.registry) and "basic_auth='***'" in repr(access)
    assert parts.kafka.producer_config()["sasl.password"] == f"{CANARY}2"  # the clear value, for librdkafka only
    assert parts.mongo.uri.reveal() == settings.mongodb_uri


def test_an_unescaped_at_sign_in_a_password_is_masked_whole_and_refused_naming_the_setting() -> None:
    from relay.mongo.config import uri_credentials

    uri = f"mongodb://relayuser:{CANARY}@tail@127.0.0.1:1/?replicaSet=rs0"
    assert redact_text(uri) == "mongodb://relayuser:***@127.0.0.1:1/?replicaSet=rs0"
    assert f"{CANARY}@tail" in uri_credentials(uri)
    with pytest.raises(ConfigError) as refused:
        Settings.load(env={"RELAY_MONGODB_URI": uri})
    assert refused.value.setting == "RELAY_MONGODB_URI" and "must be escaped" in str(refused.value)
    assert CANARY not in str(refused.value) and "tail" not in str(refused.value)
    assert scrub(f"driver: {CANARY}@tail") == "driver: ***"  # registered whole before validation


@pytest.mark.parametrize(
    ("uri", "reason"),
    [("mongodb://u:pw@h1,h2/?directConnection=true", "multiple hosts"), ("mongodb://u:pw@h:99999/", "Port"),
     ("mongodb://h/?tlsCertificateKeyFile=/nonexistent/key.pem", "No such file"),
     ("mongodb://u:pw@h/?srvMaxHosts=2", "srvMaxHosts")],
)
def test_a_uri_pymongo_refuses_is_a_config_error_naming_the_setting_without_a_traceback(
    uri: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from relay.mongo.config import MongoConfig

    def load() -> int:
        Settings.load(env={"RELAY_MONGODB_URI": uri})
        return 0

    with pytest.raises(ConfigError, match=reason):
        MongoConfig(uri=uri, database="a", change_streams="per-database", lease_collection="l",
                    connect_timeout_s=1, max_await_ms=1, read_linger_ms=0)
    assert run_command("outbox-relay", load) == 2
    err = capsys.readouterr().err
    assert err.startswith("outbox-relay: ConfigError: RELAY_MONGODB_URI: pymongo refuses the URI") and "Traceback" not in err


def test_a_srv_uri_is_checked_by_the_client_without_a_dns_lookup_at_load() -> None:
    from relay.mongo.connection import mongo_client

    config = Settings(mongodb_uri=f"mongodb+srv://u:{CANARY}@a.example,b.example/").parts().mongo  # no DNS here
    with pytest.raises(ConfigError, match="one, and only one") as refused:
        mongo_client(config)
    assert refused.value.setting == "RELAY_MONGODB_URI" and CANARY not in str(refused.value)


def test_uri_option_credentials_are_registered_as_pymongo_decodes_them() -> None:
    from relay.mongo.config import uri_credentials

    uri = (f"mongodb://u:{CANARY}%21a@h/?tls=true&tlsCertificateKeyFilePassword={CANARY}%21k"
           f"&authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:{CANARY}t")
    found = set(uri_credentials(uri))
    assert {f"{CANARY}%21a", f"{CANARY}!a", f"{CANARY}%21k", f"{CANARY}!k", f"{CANARY}t"} <= found
    assert redact_text(uri) == ("mongodb://u:***@h/?tls=true&tlsCertificateKeyFilePassword=***"
                                "&authMechanism=MONGODB-AWS&authMechanismProperties=***")


@pytest.mark.parametrize("flag", ["--kafka-property", "--kafka-option", "--spark-conf"])
def test_a_malformed_pair_is_refused_without_echoing_it(flag: str) -> None:
    from relay.config import parse_pairs

    with pytest.raises(ConfigError) as refused:
        parse_pairs(["compression.type=zstd", f"sasl.password {CANARY}"], flag)
    assert refused.value.setting == flag and "item 2" in str(refused.value) and CANARY not in str(refused.value)


def test_pairs_register_their_credentials_at_once() -> None:
    from relay.config import parse_pairs

    jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="{CANARY}j";'
    parse_pairs([f"sasl.jaas.config={jaas}", f"spark.hadoop.fs.s3a.secret.key={CANARY}s",
                 f"spark.mongodb.read.connection.uri=mongodb://u:{CANARY}m@h/"], "--kafka-option")
    assert scrub(f"{jaas} | {CANARY}j | {CANARY}s | {CANARY}m") == "*** | *** | *** | ***"


def test_a_refused_registry_url_is_named_without_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(schema_registry_url=f"ftp://reg:{CANARY}@registry/").parts()
    assert "ftp://reg:***@registry/" in str(refused.value) and CANARY not in str(refused.value)
    with pytest.raises(ConfigError) as both:  # the registry client refuses user info beside basic auth
        Settings(schema_registry_url=f"http://reg:{CANARY}@registry/", schema_registry_basic_auth="u:p1234").parts()
    assert both.value.setting == "RELAY_SCHEMA_REGISTRY_BASIC_AUTH" and CANARY not in str(both.value)

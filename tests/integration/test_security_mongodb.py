"""Least privilege and TLS on MongoDB: the relay runs as a user holding only the documented
role, in every mode, over TLS, losing nothing; a user missing one privilege gets a stop naming the
action and the namespace; the role command prints and creates exactly that role; a wrong CA or
host name stops the relay with a line that says so.

One mongod with `--auth`, a keyfile and `--tlsMode requireTLS` (a throwaway CA) for the module
(tests/security_servers.py); Kafka is the session's broker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from relay.cli import main
from relay.config import Settings
from relay.core.errors import PermissionDeniedError, ServerUnreachableError
from relay.mongo.errors import translate
from relay.mongo.privileges import Privilege, required
from tests.security_servers import AuthMongo, auth_mongo, make_certificates
from tests.support import RelayThread, Servers, assert_complete_and_ordered, read_topic, wait_until, write_events


@pytest.fixture(scope="module")
def mongo() -> Iterator[AuthMongo]:
    with auth_mongo(tls=True) as server:
        yield server


def _settings(servers: Servers, uri: str, **changes: Any) -> Settings:
    tag = uuid.uuid4().hex[:8]
    values: dict[str, Any] = dict(
        mongodb_uri=uri, kafka_bootstrap_servers=servers.kafka_bootstrap, database=f"s_{tag}",
        topic_template=f"s{tag}.{{aggregateType}}", http_port=0, instance_id=f"test-{tag}", lease_ttl_s=4.0,
        heartbeat_interval_s=1.0, standby_poll_s=0.3, max_await_ms=200, connect_timeout_s=15.0,
        restart_backoff_max_s=2.0, kafka={"message.timeout.ms": "30000"},
    )
    return Settings().replace(**(values | changes))


def _needed(settings: Settings, inbox: str | None = None) -> list[Privilege]:
    return required(settings.database, settings.outbox_collection, settings.lease_collection,
                    cleanup=bool(settings.outbox_retention), partitions=settings.partitions, inbox=inbox)


MODES = {
    "single": {},
    "partitions": {"partitions": 3},
    "exactly-once": {"delivery": "exactly-once"},
    "clean-up": {"outbox_retention": "1", "outbox_check_interval_s": 0.5},
}


def test_every_mode_runs_as_a_user_holding_only_the_documented_role(mongo: AuthMongo, servers: Servers) -> None:
    for mode, changes in MODES.items():
        settings = _settings(servers, "", **changes)
        user = f"relay{mode.replace('-', '')}"
        settings = settings.replace(mongodb_uri=mongo.user_with(user, f"pw-{uuid.uuid4().hex}", _needed(settings)))
        with mongo.admin() as admin:
            db = admin[settings.database]
            db.create_collection(settings.outbox_collection)
            written = write_events(db, settings.outbox_collection, 60, writers=2)
            with RelayThread(settings) as relay:
                topic = settings.topic_template.format(aggregateType="order")
                records = wait_until(lambda: (r := read_topic(servers.kafka_bootstrap, topic, timeout=5))
                                     and {x.id for x in r} >= written.ids and r, 120, f"{mode}: every event",
                                     interval=1, alive=relay.check_alive)
                assert_complete_and_ordered(records, written)
                if mode == "clean-up":
                    wait_until(lambda: db[settings.outbox_collection].estimated_document_count() == 0, 60,
                               "clean-up deletes the delivered events", alive=relay.check_alive)
            assert relay.error is None, f"{mode}: {relay.error!r}"
            admin.drop_database(settings.database)


def test_a_user_missing_one_privilege_is_stopped_naming_the_action_and_namespace(
    mongo: AuthMongo, servers: Servers, logs: Any
) -> None:
    settings = _settings(servers, "")
    needed = [p if p.collection != settings.outbox_collection else
              Privilege(p.db, p.collection, tuple(a for a in p.actions if a != "changeStream"), p.why)
              for p in _needed(settings)]
    settings = settings.replace(mongodb_uri=mongo.user_with("relaynochangestream", "pw-one-short", needed))
    capture = logs("json")
    with mongo.admin() as admin:
        admin[settings.database].create_collection(settings.outbox_collection)
        relay = RelayThread(settings)
        relay.start()
        relay.thread.join(60)
        admin.drop_database(settings.database)
    assert isinstance(relay.error, PermissionDeniedError)
    assert relay.error.refused == [("changeStream", f"{settings.database}.outbox")]
    [stop] = [line for line in capture.errors() if line["message"].startswith("stopping on")]
    assert stop["error_kind"] == "PermissionDeniedError" and stop["exit_code"] == 2
    assert f"changeStream on {settings.database}.outbox" in stop["message"]


def test_the_servers_refusal_is_translated_naming_the_action_and_namespace(mongo: AuthMongo, servers: Servers) -> None:
    """MongoDB's own Unauthorized (code 13), for what the start-up check cannot see coming."""
    settings = _settings(servers, "")
    uri = mongo.user_with("relayreadonly", "pw-read-only", [Privilege(settings.database, "leases", ("find",), "")])
    client: pymongo.MongoClient[Any]
    with pymongo.MongoClient(uri) as client:
        with pytest.raises(pymongo.errors.OperationFailure) as refused:
            client[settings.database]["leases"].update_one({"_id": 1}, {"$set": {"x": 1}}, upsert=True)
        with pytest.raises(pymongo.errors.OperationFailure) as watch:
            client[settings.database]["outbox"].watch().close()
    assert refused.value.code == 13
    error = translate(refused.value)
    assert isinstance(error, PermissionDeniedError)
    assert error.refused == [("update", f"{settings.database}.leases")]
    stream = translate(watch.value)
    assert isinstance(stream, PermissionDeniedError)
    assert stream.refused == [("changeStream", f"{settings.database}.outbox")]


def test_the_role_command_prints_and_creates_exactly_the_documented_role(
    mongo: AuthMongo, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_MONGODB_URI", mongo.admin_uri)
    monkeypatch.setenv("RELAY_DATABASE", "shop")
    monkeypatch.setenv("RELAY_OUTBOX_RETENTION", "7d")
    assert main(["security", "role", "--json", "--role-name", "relayShop", "--inbox", "inbox"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["createRole"] == "relayShop" and doc["roles"] == []
    resources = {(p["resource"]["db"], p["resource"]["collection"]): p["actions"] for p in doc["privileges"]}
    assert resources == {
        ("shop", "outbox"): ["find", "changeStream", "listIndexes", "remove"],
        ("shop", "outbox_relay_leases"): ["find", "insert", "update"],
        ("shop", "outbox_relay_leases_replicas"): ["find", "insert", "update"],
        ("local", "oplog.rs"): ["find"],
        ("shop", "inbox"): ["find", "insert", "update", "createIndex"],
    }
    assert main(["security", "role", "--role-name", "relayShop"]) == 0
    assert 'runCommand({' in capsys.readouterr().out
    for _ in range(2):  # created, then updated in place
        assert main(["security", "role", "--create", "--role-name", "relayShop", "--inbox", "inbox"]) == 0
    with mongo.admin() as admin:
        [info] = admin.admin.command({"rolesInfo": "relayShop", "showPrivileges": True})["roles"]
    stored = {(p["resource"]["db"], p["resource"]["collection"]): sorted(p["actions"]) for p in info["privileges"]}
    assert stored == {k: sorted(v) for k, v in resources.items()}


def test_a_wrong_ca_or_host_name_stops_the_relay_with_a_clear_line(
    mongo: AuthMongo, servers: Servers, tmp_path: Any
) -> None:
    assert mongo.certs is not None
    other = make_certificates(tmp_path, name="other")
    settings = _settings(servers, "", connect_timeout_s=3.0)
    uri = mongo.user_with("relaytls", "pw-tls-1234", _needed(settings))
    port = mongo.rs.ports[0]
    cases = {
        "wrong CA": uri.replace(str(mongo.certs.ca), str(other.ca)),
        "wrong host name": f"mongodb://relaytls:pw-tls-1234@localhost:{port}/?directConnection=true&authSource=admin"
                           f"&tls=true&tlsCAFile={mongo.certs.ca}",  # the certificate names 127.0.0.1
    }
    expected = {"wrong CA": "certificate verify failed", "wrong host name": "localhost"}
    for case, bad in cases.items():
        relay = RelayThread(settings.replace(mongodb_uri=bad))
        relay.start()
        relay.thread.join(60)
        error = relay.error
        assert isinstance(error, ServerUnreachableError), f"{case}: {error!r}"
        assert "cannot reach MongoDB at mongodb://relaytls:***@" in str(error) and "pw-tls-1234" not in str(error)
        assert "CERTIFICATE_VERIFY_FAILED" in str(error) and expected[case] in str(error), f"{case}: {error}"

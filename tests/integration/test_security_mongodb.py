"""Least privilege and TLS on MongoDB: the relay runs as a user holding only the documented
role, in every mode, over TLS, losing nothing, also when the partition count changes; so does relay.inbox with its collection's
privileges (and a retention change needs `collMod`); a user missing one privilege gets a stop
naming the action and the namespace; the role command prints and creates exactly that role; a
wrong CA or host name stops the relay with a line that says so.

One mongod with `--auth`, a keyfile and `--tlsMode requireTLS` (a throwaway CA) for the module
(tests/security_servers.py); Kafka is the session's broker.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from confluent_kafka import Producer

from relay.avro.folder import SchemaFolder
from relay.cli import main
from relay.config import Settings
from relay.core.errors import PermissionDeniedError, ServerUnreachableError
from relay.mongo.errors import translate
from relay.mongo.privileges import Privilege, required, required_for
from relay.outbox import OutboxEvent
from relay.wiring import message_builder
from tests.changes import change_value
from tests.inbox_support import InboxThread
from tests.security_servers import AuthMongo, auth_mongo, make_certificates
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.servers import Servers
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import write_events


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
    return required(settings.database, settings.namespaces, settings.lease_collection,
                    cleanup=bool(settings.outbox_retention), inbox=inbox)


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



def test_many_outboxes_run_as_a_user_holding_only_the_role_printed_for_the_set(
    mongo: AuthMongo, servers: Servers
) -> None:
    """RELAY_OUTBOXES over two databases (two outboxes in one: its database's change stream; one in
    the other: a collection's), with clean-up: the role `security role` prints for the set is enough."""
    settings = _settings(servers, "", outbox_retention="1", outbox_check_interval_s=0.5)
    other = f"{settings.database}_2"
    names = [f"{settings.database}.a", f"{settings.database}.b", f"{other}.c"]
    settings = settings.replace(outboxes=",".join(names),
                                topic_template=settings.topic_template.replace("{aggregateType}", "{collection}"))
    parts = settings.replace(mongodb_uri="mongodb://localhost/").parts()
    needed = required_for(parts.mongo, parts.outboxes, parts.cleanup)
    assert {(p.db, p.collection) for p in needed} >= {(settings.database, ""), (other, "c")}, needed
    settings = settings.replace(mongodb_uri=mongo.user_with("relayoutboxes", f"pw-{uuid.uuid4().hex}", needed))
    with mongo.admin() as admin:
        written = {}
        for name in names:
            db, coll = name.split(".")
            admin[db].create_collection(coll)
            written[name] = write_events(admin[db], coll, 30, writers=1)
        with RelayThread(settings) as relay:
            for name in names:
                topic = settings.topic_template.format(collection=name.split(".")[1])
                wait_until(lambda topic=topic, name=name: {r.id for r in read_topic(servers.kafka_bootstrap, topic, timeout=5)}
                           >= written[name].ids, 120, f"every event of {name}", interval=1, alive=relay.check_alive)
            for name in names:
                db, coll = name.split(".")
                wait_until(lambda db=db, coll=coll: admin[db][coll].estimated_document_count() == 0, 60,
                           f"clean-up of {name}", alive=relay.check_alive)
        assert relay.error is None, repr(relay.error)
        admin.drop_database(settings.database)
        admin.drop_database(other)


def test_changing_the_partition_count_runs_as_a_user_holding_only_the_documented_role(
    mongo: AuthMongo, servers: Servers
) -> None:
    """3 partitions, then 1, on one outbox: the start with the new count replaces the lease
    documents (`remove` on the lease collection), which is why every mode's role holds it."""
    settings = _settings(servers, "")
    settings = settings.replace(mongodb_uri=mongo.user_with("relaypartitions", f"pw-{uuid.uuid4().hex}",
                                                            _needed(settings)))
    topic = settings.topic_template.format(aggregateType="order")
    with mongo.admin() as admin:
        db = admin[settings.database]
        db.create_collection(settings.outbox_collection)
        written = write_events(db, settings.outbox_collection, 30, writers=1)
        for count, seed in ((3, 1), (1, 2)):
            if count == 1:
                write_events(db, settings.outbox_collection, 30, writers=1, seed=seed, written=written)
            with RelayThread(settings.replace(partitions=count)) as relay:
                wait_until(lambda: {r.id for r in read_topic(servers.kafka_bootstrap, topic, timeout=5)} >= written.ids,
                           120, f"{count} partition(s): every event", interval=1, alive=relay.check_alive)
            assert relay.error is None, f"{count} partition(s): {relay.error!r}"
        assert_complete_and_ordered(read_topic(servers.kafka_bootstrap, topic), written)
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
        ("shop", "outbox_relay_leases"): ["find", "insert", "update", "remove"],
        ("shop", "outbox_relay_leases_replicas"): ["find", "insert", "update"],
        ("local", "oplog.rs"): ["find"],
        ("shop", "inbox"): ["find", "insert", "createIndex", "collMod"],
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


def _publish_events(bootstrap: str, topic: str, total: int) -> None:
    """`total` events as the relay writes them (its own message builder), straight to `topic`."""
    builder = message_builder(Settings(), SchemaFolder.bundled())
    token = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}
    with Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "true"}) as producer:
        for i in range(total):
            doc = OutboxEvent.new("order", f"o-{i % 7}", "Changed", {"seq": i}, trace_context=False).to_document()
            msg = builder.build(change_value(doc, token), 1)
            producer.produce(topic, msg.value, msg.key, headers=msg.headers)
        assert producer.flush(30) == 0


def test_the_inbox_runs_as_a_user_holding_only_its_documented_privileges(mongo: AuthMongo, servers: Servers) -> None:
    """The inbox collection's privileges (`required(..., inbox=)`, nothing else on it: no `update`)
    plus the handler's own; a second start with another retention changes the TTL index, which a
    user without `collMod` is refused."""
    settings = _settings(servers, "")
    inbox_privilege = next(p for p in _needed(settings, inbox="inbox") if p.collection == "inbox")
    handler_privilege = Privilege(settings.database, "effects", ("find", "insert", "update"), "the handler's")
    topic = settings.topic_template.format(aggregateType="order")
    _publish_events(servers.kafka_bootstrap, topic, 50)

    def consume(uri: str, retention: dt.timedelta, done: Any) -> BaseException | None:
        """Run the inbox as the user of `uri` until `done(inbox)` (or it failed); its error."""
        with pymongo.MongoClient(uri, tz_aware=True) as client:
            db = client[settings.database]
            def handle(event: Any, session: Any) -> None:
                db.effects.update_one({"_id": event.aggregate_id}, {"$inc": {"n": 1}}, upsert=True, session=session)
            with InboxThread(db, handle, retention=retention, topics=[topic], group_id="shipping",
                             bootstrap_servers=servers.kafka_bootstrap) as inbox:
                wait_until(lambda: done(inbox) or not inbox.thread.is_alive(), 60, "the inbox at work", interval=0.5)
        return inbox.error

    uri = mongo.user_with("relayinbox", f"pw-{uuid.uuid4().hex}", [inbox_privilege, handler_privilege])
    with mongo.admin() as admin:
        db = admin[settings.database]
        def ttl() -> int:
            return int(db.inbox.index_information()["retention"]["expireAfterSeconds"])

        applied = consume(uri, dt.timedelta(days=7),
                          lambda inbox: inbox.metric("relay_inbox_events_processed_total", topic=topic) >= 50)
        assert applied is None, repr(applied)
        assert sum(d["n"] for d in db.effects.find()) == 50 and db.inbox.count_documents({}) == 50
        changed = consume(uri, dt.timedelta(days=2), lambda inbox: ttl() == 2 * 24 * 3600)  # collMod
        assert changed is None and ttl() == 2 * 24 * 3600, repr(changed)
        without = Privilege(inbox_privilege.db, "inbox", tuple(a for a in inbox_privilege.actions if a != "collMod"), "")
        short = mongo.user_with("relayinboxnocollmod", f"pw-{uuid.uuid4().hex}", [without, handler_privilege])
        refused = consume(short, dt.timedelta(days=1), lambda inbox: False)
        admin.drop_database(settings.database)
    assert isinstance(refused, pymongo.errors.OperationFailure) and refused.code == 13, repr(refused)
    assert "collMod" in str(refused)
    assert sum(1 for a in inbox_privilege.actions if a == "update") == 0

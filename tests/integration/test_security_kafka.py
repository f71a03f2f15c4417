"""Least privilege and TLS on Kafka: a KRaft broker with SASL/SCRAM over TLS (SASL_SSL, a
throwaway CA) and StandardAuthorizer; the relay's principal holds exactly the documented ACLs
(relay.kafka.acls) and every mode works, losing nothing; a missing ACL stops the relay naming the
resource and the operation; a wrong CA or host name stops it with a line that says so.

One SASL broker for the module (tests/security_servers.py); MongoDB is the session's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from relay.config import Settings
from relay.core.errors import PermissionDeniedError, ServerUnreachableError
from relay.kafka.acls import Acl, required
from tests.security_servers import SaslKafka, make_certificates, sasl_kafka
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.servers import Servers
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import write_events


@pytest.fixture(scope="module")
def kafka() -> Iterator[SaslKafka]:
    with sasl_kafka() as server:
        yield server


def _settings(servers: Servers, kafka: SaslKafka, **changes: Any) -> Settings:
    tag = uuid.uuid4().hex[:8]
    values: dict[str, Any] = dict(
        mongodb_uri=servers.mongodb_uri, kafka_bootstrap_servers=kafka.broker.bootstrap_servers, database=f"k_{tag}",
        topic_template=f"k{tag}.{{aggregateType}}", http_port=0, instance_id=f"test-{tag}", lease_ttl_s=4.0,
        heartbeat_interval_s=1.0, standby_poll_s=0.3, max_await_ms=200, connect_timeout_s=15.0,
        restart_backoff_max_s=2.0, offsets_topic=f"k{tag}-offsets",
    )
    return Settings().replace(**(values | changes))


def _acls(settings: Settings) -> list[Acl]:
    return required(settings.topic_template, exactly_once=settings.delivery == "exactly-once",
                    offsets_topic=settings.offsets_topic)


def _as_user(kafka: SaslKafka, settings: Settings, acls: list[Acl]) -> Settings:
    user = f"relay-{settings.database}"
    client = kafka.add_user(user, f"pw-{uuid.uuid4().hex}")
    kafka.grant(user, acls)
    return settings.replace(kafka={**client, "message.timeout.ms": "30000"})


MODES = {"single": {}, "partitions": {"partitions": 2}, "exactly-once": {"delivery": "exactly-once"}}


def test_every_mode_runs_with_exactly_the_documented_acls(kafka: SaslKafka, servers: Servers) -> None:
    client: pymongo.MongoClient[Any]
    with pymongo.MongoClient(servers.mongodb_uri, tz_aware=True) as client:
        for mode, changes in MODES.items():
            settings = _settings(servers, kafka, **changes)
            topic = settings.topic_template.format(aggregateType="order")
            kafka.create_topics(topic)  # beforehand: the relay's principal holds no CREATE on topics
            settings = _as_user(kafka, settings, _acls(settings))
            db = client[settings.database]
            db.create_collection(settings.outbox_collection)
            written = write_events(db, settings.outbox_collection, 60, writers=2)
            with RelayThread(settings) as relay:
                records = wait_until(
                    lambda: (r := read_topic(kafka.broker.bootstrap_servers, topic, timeout=5,
                                             client=kafka.admin_client)) and {x.id for x in r} >= written.ids and r,
                    120, f"{mode}: every event", interval=1, alive=relay.check_alive)
                assert_complete_and_ordered(records, written)
            assert relay.error is None, f"{mode}: {relay.error!r}"
            client.drop_database(settings.database)


def _stops_with(settings: Settings, servers: Servers, kind: type[Exception] = PermissionDeniedError) -> Any:
    with pymongo.MongoClient(servers.mongodb_uri) as client:
        db = client[settings.database]
        db.create_collection(settings.outbox_collection)
        write_events(db, settings.outbox_collection, 5, writers=1)
        relay = RelayThread(settings)
        relay.start()
        relay.thread.join(90)
        client.drop_database(settings.database)
    if relay.thread.is_alive():
        relay.stop()
    assert isinstance(relay.error, kind), repr(relay.error)
    return relay.error


def test_a_missing_topic_acl_stops_the_relay_naming_the_topic_and_operation(
    kafka: SaslKafka, servers: Servers
) -> None:
    settings = _settings(servers, kafka)
    topic = settings.topic_template.format(aggregateType="order")
    kafka.create_topics(topic)
    # WRITE on some other topic: enough for an idempotent producer id (KIP-679), not for these topics
    others = [Acl("TOPIC", "unrelated.", "PREFIXED", "WRITE")]
    settings = _as_user(kafka, settings, [a for a in _acls(settings) if a.operation != "WRITE"] + others)
    error = _stops_with(settings, servers)
    assert error.refused == [("WRITE, DESCRIBE (TOPIC_AUTHORIZATION_FAILED)", f"TOPIC {topic}")]
    assert error.exit_code == 2


def test_a_missing_transactional_id_acl_stops_the_relay_naming_it(kafka: SaslKafka, servers: Servers) -> None:
    settings = _settings(servers, kafka, delivery="exactly-once")
    kafka.create_topics(settings.topic_template.format(aggregateType="order"))
    settings = _as_user(kafka, settings, [a for a in _acls(settings) if a.resource != "TRANSACTIONAL_ID"])
    error = _stops_with(settings, servers)
    [(operation, resource)] = error.refused
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in operation
    assert resource == f"TRANSACTIONAL_ID outbox-relay:{settings.namespaces[0]}"


def test_a_wrong_ca_or_host_name_stops_the_relay_with_a_clear_line(
    kafka: SaslKafka, servers: Servers, tmp_path: Any
) -> None:
    other = make_certificates(tmp_path, name="other")
    settings = _settings(servers, kafka, connect_timeout_s=3.0)
    client = {**kafka.client("relay-tls", "pw-tls-1234"), "message.timeout.ms": "30000"}
    cases = {
        "wrong CA": (settings.kafka_bootstrap_servers, {**client, "ssl.ca.location": str(other.ca)}),
        "wrong host name": (f"localhost:{kafka.broker.port}", client),  # the certificate names 127.0.0.1
    }
    for case, (bootstrap, properties) in cases.items():
        error = _stops_with(settings.replace(kafka_bootstrap_servers=bootstrap, kafka=properties), servers,
                            ServerUnreachableError)
        assert f"cannot reach Kafka at {bootstrap}" in str(error), case
        # librdkafka words it "SSL handshake failed: ... certificate verify failed" or
        # "... certificate verify failed (after N ms in state SSL_HANDSHAKE)", by timing.
        text = str(error)
        assert "certificate verify failed" in text and ("SSL handshake" in text or "SSL_HANDSHAKE" in text), f"{case}: {text}"


def test_a_wrong_sasl_password_stops_the_relay_saying_so_without_printing_it(
    kafka: SaslKafka, servers: Servers, logs: Any
) -> None:
    wrong = f"Wrong-Canary-{uuid.uuid4().hex[:8]}"
    kafka.add_user("relay-wrongpw", "pw-right-1234")
    settings = Settings.load(env={"RELAY_KAFKA_SASL_PASSWORD": wrong})  # registers it, as the command line does
    settings = _settings(servers, kafka, connect_timeout_s=3.0).replace(
        kafka={**kafka.client("relay-wrongpw", wrong), "message.timeout.ms": "30000"})
    capture = logs("json", "DEBUG")
    error = _stops_with(settings, servers, ServerUnreachableError)
    assert "Authentication failed" in str(error) and "SCRAM-SHA-256" in str(error), str(error)
    assert wrong not in str(error) and wrong not in capture.text
    assert "stopping on ServerUnreachableError" in capture.text


def _offsets_topic(kafka: SaslKafka, topic: str, record: bool) -> None:
    """The offsets topic made beforehand by the administrator, compacted; with `record`, holding
    one record (of another lease), so that a leader reads it at start."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    with kafka.admin() as admin:
        [future] = admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})]).values()
        future.result(timeout=30)
    if record:
        with Producer({"bootstrap.servers": kafka.broker.bootstrap_servers, **kafka.admin_client}) as producer:
            producer.produce(topic, b"not-a-record", b"some.other#lease")
            assert producer.flush(30) == 0


@pytest.mark.parametrize(
    ("missing", "made", "step"),
    [("CREATE", None, "create the offsets topic"), ("DESCRIBE_CONFIGS", "empty", "check the offsets topic"),
     ("READ", "with a record", "read the offsets topic")],
)
def test_a_missing_offsets_topic_acl_stops_the_relay_naming_the_topic_and_the_operation(
    kafka: SaslKafka, servers: Servers, missing: str, made: str | None, step: str
) -> None:
    settings = _settings(servers, kafka, delivery="exactly-once")
    kafka.create_topics(settings.topic_template.format(aggregateType="order"))
    if made is not None:
        _offsets_topic(kafka, settings.offsets_topic, record=made == "with a record")
    acls = [a for a in _acls(settings) if not (a.name == settings.offsets_topic and a.operation == missing)]
    error = _stops_with(_as_user(kafka, settings, acls), servers)
    assert error.refused == [(f"{missing} (TOPIC_AUTHORIZATION_FAILED)", f"TOPIC {settings.offsets_topic}")]
    assert step in str(error) and error.exit_code == 2


def test_the_offsets_reader_needs_its_group_acl(kafka: SaslKafka, servers: Servers) -> None:
    """The reader of the offsets topic assigns its partition and commits nothing, but librdkafka
    still asks the group coordinator for its throw-away group: without READ on the group prefix
    the relay stops naming the group."""
    settings = _settings(servers, kafka, delivery="exactly-once")
    kafka.create_topics(settings.topic_template.format(aggregateType="order"))
    _offsets_topic(kafka, settings.offsets_topic, record=True)
    error = _stops_with(_as_user(kafka, settings, [a for a in _acls(settings) if a.resource != "GROUP"]), servers)
    [(operation, resource)] = error.refused
    assert operation == "READ (GROUP_AUTHORIZATION_FAILED)" and resource.startswith("GROUP outbox-relay-offsets-")


def _reader(kafka: SaslKafka, settings: Settings, acls: list[Acl]) -> Settings:
    user = f"reader-{settings.database}"
    client = kafka.add_user(user, f"pw-{uuid.uuid4().hex}")
    kafka.grant(user, acls)
    return settings.replace(kafka=client)


def test_tail_reads_with_exactly_the_documented_reader_acls_and_names_a_missing_one(
    kafka: SaslKafka, servers: Servers
) -> None:
    import io

    from confluent_kafka import Producer

    from relay.commands.tail import tail
    from relay.kafka.acls import TAIL_GROUP_PREFIX, required_to_read

    settings = _settings(servers, kafka, connect_timeout_s=10.0)
    topic = settings.topic_template.format(aggregateType="order")
    kafka.create_topics(topic, partitions=1)
    with Producer({"bootstrap.servers": kafka.broker.bootstrap_servers, **kafka.admin_client}) as producer:
        for n in range(3):
            producer.produce(topic, f"not avro {n}".encode(), b"k")
        assert producer.flush(30) == 0
    acls = required_to_read(settings.topic_template, TAIL_GROUP_PREFIX)
    out = io.StringIO()
    assert tail(_reader(kafka, settings, acls), topic, from_beginning=True, max_messages=3, out=out) == 0
    assert len(out.getvalue().splitlines()) == 3
    no_group = _reader(kafka, settings.replace(database=f"{settings.database}g"), [a for a in acls if a.resource != "GROUP"])
    with pytest.raises(PermissionDeniedError) as refused:
        tail(no_group, topic, from_beginning=True, max_messages=3, out=io.StringIO())
    assert refused.value.refused == [("READ (GROUP_AUTHORIZATION_FAILED)", f"GROUP {TAIL_GROUP_PREFIX}*")]


def test_the_inbox_consumes_with_exactly_the_documented_acls_and_names_a_missing_group_acl(
    kafka: SaslKafka, servers: Servers
) -> None:
    """The relay (as the admin) publishes 40 events; an inbox consumer whose principal holds
    exactly `required_to_consume` (dead-letter mode: WRITE on that topic too) applies each once;
    without its group's READ, `run` stops naming the group and the operation."""
    import threading

    from relay.inbox import Inbox
    from relay.kafka.acls import required_to_consume
    from tests.inbox_support import INBOX, applied_count, assert_effects_exactly_once_in_order, effects_handler

    settings = _settings(servers, kafka)
    topic, dead_letters = settings.topic_template.format(aggregateType="order"), f"{settings.database}-dead"
    kafka.create_topics(topic, dead_letters)
    client: pymongo.MongoClient[Any]
    with pymongo.MongoClient(servers.mongodb_uri, tz_aware=True) as client:
        db = client[settings.database]
        written = write_events(db, settings.outbox_collection, 40, writers=2)
        with RelayThread(settings.replace(kafka=dict(kafka.admin_client))):
            wait_until(lambda: len(read_topic(kafka.broker.bootstrap_servers, topic, timeout=5,
                                              client=kafka.admin_client)) >= 40, 120, "40 events", interval=1)
        group = f"shipping-{settings.database}"
        consumer = _reader(kafka, settings, required_to_consume([topic], group, dead_letters))
        options = dict(topics=[topic], group_id=group, bootstrap_servers=kafka.broker.bootstrap_servers,
                       kafka=dict(consumer.kafka), on_poison="dead-letter", dead_letter_topic=dead_letters)
        inbox, errors = Inbox(db[INBOX]), []
        thread = threading.Thread(target=lambda: _capture(errors, inbox.run, effects_handler(db), **options))
        thread.start()
        try:
            wait_until(lambda: applied_count(db) >= 40 or errors, 120, "the inbox to apply 40 events")
        finally:
            inbox.stop()
            thread.join(60)
        assert not errors, errors
        assert_effects_exactly_once_in_order(db, written)
        no_group = _reader(kafka, settings.replace(database=f"{settings.database}n"), required_to_consume([topic], "x"))
        with pytest.raises(PermissionDeniedError) as refused:
            Inbox(db[INBOX]).run(effects_handler(db), **(options | {"group_id": f"{group}-2", "kafka": dict(no_group.kafka),
                                                                   "on_poison": "stop"}))
        assert refused.value.refused == [("READ (GROUP_AUTHORIZATION_FAILED)", f"GROUP {group}-2")]
        client.drop_database(settings.database)


def _capture(errors: list[BaseException], run: Any, *args: Any, **kwargs: Any) -> None:
    try:
        run(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        errors.append(exc)

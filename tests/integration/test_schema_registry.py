"""The Confluent wire format against a real Schema Registry server (Apicurio Registry serving the
Confluent API, started by relay.dev.registry; the `schema_registry` fixture).

The relay publishes from a real MongoDB to a real Kafka broker; the values are read back with a
plain confluent-kafka consumer and `AvroDeserializer` against the server (its own client, not
the relay's cache) and compared with the outbox. The mock-client tests in
tests/unit/test_avro_framing.py stay as the fast layer.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from bson import json_util
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from prometheus_client.parser import text_string_to_metric_families

from relay.avro.folder import SchemaFolder
from relay.core.errors import EXIT_DATA
from relay.dev.stack import free_port
from relay.outbox import Outbox, OutboxEvent
from tests.support.oracle import assert_complete_and_ordered
from tests.support.paths import ROOT
from tests.support.relays import RelayProcess, RelayThread, settings_env
from tests.support.topics import Record, read_messages, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events

TYPED = "io.outboxrelay.v1.events.OrderCreated"
GENERIC = "io.outboxrelay.v1.OutboxEvent"
FOLDER = SchemaFolder.bundled()


# ---- helpers -----------------------------------------------------------------------------------

def registry_settings(env: Any, registry: Any, **kw: Any) -> Any:
    return env.settings.replace(schema_registry_url=registry.url, **kw)


def client(registry: Any) -> SchemaRegistryClient:
    """A client of our own: nothing cached from what the relay registered."""
    return SchemaRegistryClient({"url": registry.url, "timeout": 10})


def confluent_records(env: Any, registry: Any, topic: str) -> list[Record]:
    """Every message of `topic`, checked to be in the Confluent wire format and decoded by
    confluent-kafka's AvroDeserializer through the server."""
    deserializer = AvroDeserializer(client(registry))
    records = []
    for msg in read_messages(env.servers.kafka_bootstrap, topic):
        value = msg.value()
        assert value[0] == 0, f"{topic}@{msg.offset()} is not in the Confluent wire format: {value[:11].hex()}"
        event = deserializer(value, SerializationContext(topic, MessageField.VALUE))
        records.append(Record(msg.topic(), msg.partition(), msg.offset(), msg.key().decode(), event,
                              {k: v.decode() for k, v in (msg.headers() or [])}))
    return records


def schema_ids(env: Any, topic: str) -> list[int]:
    return [int.from_bytes(m.value()[1:5], "big") for m in read_messages(env.servers.kafka_bootstrap, topic)]


def assert_equal_to_the_outbox(records: list[Record], outbox: Any) -> None:
    """Each decoded message holds its outbox document: ids, routing, time and payload (typed
    records as the document, the generic envelope's Extended JSON text parsed back)."""
    docs = {str(d["_id"]): d for d in outbox.find()}
    for r in records:
        doc, event = docs[r.id], r.event
        assert (event["aggregateType"], event["aggregateId"], event["eventType"], r.key) == \
            (doc["aggregateType"], doc["aggregateId"], doc["eventType"], doc["aggregateId"])
        assert event["occurredAt"] == doc["occurredAt"]
        payload = event["payload"] if isinstance(event["payload"], dict) else json_util.loads(event["payload"])
        assert payload == doc["payload"], (r.id, payload, doc["payload"])


def our_subjects(registry: Any, env: Any) -> set[str]:
    prefix = env.topic("")
    return {s for s in client(registry).get_subjects() if s.startswith(prefix)}


def order_created(i: int, aggregate: str = "o-1") -> OutboxEvent:
    return OutboxEvent.new("order", aggregate, "OrderCreated", {"orderId": aggregate, "amount": 12.5 + i, "step": i})


def run_until_exit(settings: Any, tmp_path: Path, name: str) -> tuple[int, str]:
    relay = RelayProcess(settings, tmp_path, name).start()
    assert relay.proc is not None
    try:
        code = relay.proc.wait(timeout=120)
    finally:
        relay.stop()
    return code, relay.log()


def restarts(relay: RelayProcess, port: int, kind: str) -> float:
    """`relay_restarts_total{kind}` from the relay's /metrics; fails if the relay exited."""
    assert relay.alive, f"the relay exited ({relay.returncode}):\n{relay.log()[-3000:]}"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return 0.0  # starting, or exiting (the next call says so)
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "relay_restarts_total" and s.labels.get("kind") == kind)


# ---- publishing and reading ------------------------------------------------------------------

def test_relay_publishes_typed_and_generic_events_that_a_plain_avro_deserializer_reads_back(env, schema_registry):
    """Default strategy topic-record: one subject per (topic, event schema); the same schema on
    two topics has one id (Apicurio's content ids, as in Confluent's registry)."""
    settings = registry_settings(env, schema_registry)
    outbox = Outbox(env.outbox)
    with RelayThread(settings) as relay:
        written = write_events(env.db, settings.outbox_collection, total=300, writers=2)  # generic "Changed"
        customers = write_events(env.db, settings.outbox_collection, total=50, writers=1, aggregate_type="customer")
        typed = [order_created(i, f"typed-{i % 5}") for i in range(40)]
        outbox.add_many(typed)  # one insert each, in order
        written.add(typed)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 340
                   and topic_size(env.servers.kafka_bootstrap, env.topic("customer")) >= 50, 90, "390 events")
    assert relay.error is None, relay.error

    orders, customer_records = confluent_records(env, schema_registry, env.topic()), \
        confluent_records(env, schema_registry, env.topic("customer"))
    assert_complete_and_ordered(orders, written)
    assert_complete_and_ordered(customer_records, customers)
    assert_equal_to_the_outbox(orders + customer_records, env.outbox)
    assert {r.event["eventType"] for r in orders} == {"Changed", "OrderCreated"}

    subjects = {f"{env.topic()}-{TYPED}", f"{env.topic()}-{GENERIC}", f"{env.topic('customer')}-{GENERIC}"}
    assert our_subjects(schema_registry, env) == subjects
    registered = {s: client(schema_registry).get_latest_version(s).schema_id for s in subjects}
    assert registered[f"{env.topic()}-{GENERIC}"] == registered[f"{env.topic('customer')}-{GENERIC}"], \
        "one schema, one id, whatever the subject (content ids)"
    assert set(schema_ids(env, env.topic())) == {registered[f"{env.topic()}-{TYPED}"],
                                                 registered[f"{env.topic()}-{GENERIC}"]}


@pytest.mark.parametrize("strategy", ["topic", "record"])
def test_the_other_subject_strategies_register_what_the_readme_says(env, schema_registry, strategy):
    """One event schema per topic here: typed OrderCreated on the order topic, generic events on
    the customer topic (`topic` puts a topic's schemas under one subject; see the next test)."""
    settings = registry_settings(env, schema_registry, schema_registry_subject_strategy=strategy)
    typed = [order_created(i, f"typed-{i % 3}") for i in range(12)]
    with RelayThread(settings) as relay:
        Outbox(env.outbox).add_many(typed)
        customers = write_events(env.db, settings.outbox_collection, total=20, writers=1, aggregate_type="customer")
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 12
                   and topic_size(env.servers.kafka_bootstrap, env.topic("customer")) >= 20, 60, "32 events")
    assert relay.error is None, relay.error

    orders = confluent_records(env, schema_registry, env.topic())
    customer_records = confluent_records(env, schema_registry, env.topic("customer"))
    written = Written()
    written.add(typed)
    assert_complete_and_ordered(orders, written)
    assert_complete_and_ordered(customer_records, customers)
    assert_equal_to_the_outbox(orders + customer_records, env.outbox)

    registry = client(schema_registry)
    if strategy == "topic":
        expected = {f"{env.topic()}-value": TYPED, f"{env.topic('customer')}-value": GENERIC}
        assert our_subjects(schema_registry, env) == set(expected)
    else:  # record: the record's full name, shared by every topic (and every test) writing it
        expected = {TYPED: TYPED, GENERIC: GENERIC}
        assert our_subjects(schema_registry, env) == set()
    for subject, name in expected.items():
        found = registry.lookup_schema(subject, Schema(json.dumps(FOLDER.raw(name)), "AVRO"))
        topic = env.topic() if name == TYPED else env.topic("customer")
        assert set(schema_ids(env, topic)) == {found.schema_id}, subject


def test_topic_strategy_with_two_event_schemas_on_one_topic_stops_the_relay_naming_the_subject(
        env, schema_registry, tmp_path):
    """Under BACKWARD compatibility (Confluent's default) a subject's versions must read each
    other's data: the typed and the generic envelope, different records, cannot share a subject."""
    settings = registry_settings(env, schema_registry, schema_registry_subject_strategy="topic")
    subject = f"{env.topic()}-value"
    client(schema_registry).set_compatibility(subject, "BACKWARD")
    Outbox(env.outbox).add(OutboxEvent.new("order", "o-1", "OrderPaid", {"amount": 1}))
    Outbox(env.outbox).add(order_created(1))
    code, log = run_until_exit(settings, tmp_path, "relay")
    assert code == EXIT_DATA, log[-3000:]
    assert "SchemaRegistryRefusedError" in log and f"under subject {subject}" in log, log[-3000:]


# ---- refusals stop the relay (exit 4) ---------------------------------------------------------

def test_with_auto_register_off_an_unregistered_schema_stops_the_relay_until_it_is_registered(
        env, schema_registry, tmp_path):
    settings = registry_settings(env, schema_registry, schema_registry_auto_register=False)
    subject = f"{env.topic()}-{TYPED}"
    event = order_created(1)
    Outbox(env.outbox).add(event)

    code, log = run_until_exit(settings, tmp_path, "unregistered")
    assert code == EXIT_DATA, log[-3000:]
    assert f"under subject {subject}" in log and "40401" in log, log[-3000:]
    assert topic_size(env.servers.kafka_bootstrap, env.topic()) == 0

    # The operator registers it; the relay, started again, publishes the event: nothing lost.
    schema_id = client(schema_registry).register_schema(subject, Schema(json.dumps(FOLDER.raw(TYPED)), "AVRO"))
    with RelayThread(settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the event")
    assert relay.error is None, relay.error
    [record] = confluent_records(env, schema_registry, env.topic())
    assert record.id == event.id_str and schema_ids(env, env.topic()) == [schema_id]


def test_a_subject_compatibility_level_that_refuses_the_relays_schema_stops_it_naming_the_subject(
        env, schema_registry, tmp_path):
    """The subject holds an older OrderCreated with a required `currency` the relay's lacks: a
    BACKWARD subject accepts the relay's (new readers ignore the field), a FORWARD one refuses it
    (old readers would miss it)."""
    registry = client(schema_registry)
    subject = f"{env.topic()}-{TYPED}"
    older = copy.deepcopy(FOLDER.raw(TYPED))
    older["fields"].append({"name": "currency", "type": "string"})
    registry.register_schema(subject, Schema(json.dumps(older), "AVRO"))
    registry.set_compatibility(subject, "FORWARD")
    settings = registry_settings(env, schema_registry)
    event = order_created(1)
    Outbox(env.outbox).add(event)

    code, log = run_until_exit(settings, tmp_path, "forward")
    assert code == EXIT_DATA, log[-3000:]
    assert f"under subject {subject}" in log and "409" in log, log[-3000:]
    assert topic_size(env.servers.kafka_bootstrap, env.topic()) == 0

    registry.set_compatibility(subject, "BACKWARD")
    with RelayThread(settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 1, 60, "the event")
    assert relay.error is None, relay.error
    assert [r.id for r in confluent_records(env, schema_registry, env.topic())] == [event.id_str]
    assert registry.get_latest_version(subject).version == 2


# ---- the registry unavailable mid-run ---------------------------------------------------------

def _registry_outage(env: Any, registry: Any, tmp_path: Path, outage: Any, recover: Any) -> None:
    """The relay publishes order events (their subjects registered), then the registry goes away
    while customer events (a new topic: a new subject) and more order events are written. The
    relay restarts from its checkpoint with backoff until the registry is back, then publishes
    everything: no loss, per-key order, on both topics."""
    http_port = free_port()
    settings = registry_settings(env, registry, http_port=http_port)
    relay = RelayProcess(settings, tmp_path, "relay").start()
    try:
        orders = write_events(env.db, settings.outbox_collection, total=100, writers=2)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 100, 60, "the first orders")
        outage()
        customers = Written()
        writer = threading.Thread(target=lambda: (
            write_events(env.db, settings.outbox_collection, total=40, writers=1, aggregate_type="customer",
                         written=customers, seed=2),
            write_events(env.db, settings.outbox_collection, total=200, writers=2, written=orders, seed=3)),
            daemon=True)
        writer.start()
        wait_until(lambda: restarts(relay, http_port, "SchemaRegistryUnavailableError") >= 1, 120,
                   "a restart on the unavailable registry")
        writer.join(timeout=120)
        assert relay.alive, relay.log()[-3000:]
        recover()
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic("customer")) >= 40
                   and topic_size(env.servers.kafka_bootstrap, env.topic()) >= 300, 120, "every event")
        assert relay.terminate() == 0
    finally:
        relay.stop()
    assert_complete_and_ordered(confluent_records(env, registry, env.topic()), orders)
    assert_complete_and_ordered(confluent_records(env, registry, env.topic("customer")), customers)
    assert len(set(schema_ids(env, env.topic()))) == 1, "the order topic's schema kept its id"


def test_registry_paused_mid_run_the_relay_restarts_with_backoff_and_loses_nothing(env, schema_registry, tmp_path):
    server = schema_registry.server
    if server is None:
        pytest.skip("pauses the registry: needs the one the tests started")
    try:
        _registry_outage(env, schema_registry, tmp_path, server.pause, server.resume)
    finally:
        server.resume()


def test_registry_killed_mid_run_and_restarted_the_relay_loses_nothing(env, tmp_path):
    """Its own registry with durable (H2 file) storage, so the restarted server keeps its ids, as
    a production registry does."""
    from relay.dev.registry import SchemaRegistryServer

    server = SchemaRegistryServer(Path(tempfile.mkdtemp(prefix="registry-kill-", dir=tmp_path)), persistent=True)
    server.start()
    try:
        _registry_outage(env, server, tmp_path, server.kill, server.start)
    finally:
        server.stop()


# ---- tail --------------------------------------------------------------------------------------

def test_tail_decodes_confluent_framed_messages_through_the_server(env, schema_registry):
    settings = registry_settings(env, schema_registry)
    events = [order_created(1), OutboxEvent.new("order", "o-1", "OrderPaid", {"amount": 12.5, "when": [1, None]})]
    with RelayThread(settings) as relay:
        Outbox(env.outbox).add_many(events)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 2, 60, "two events")
    assert relay.error is None, relay.error

    result = subprocess.run([sys.executable, "-m", "relay", "tail", env.topic(), "--from-beginning"],
                            capture_output=True, text=True, env=settings_env(settings), cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["framing"], line["schema"]) for line in lines] == [("confluent", TYPED), ("confluent", GENERIC)]
    registry = client(schema_registry)
    assert [line["schemaRef"] for line in lines] == [
        str(registry.get_latest_version(f"{env.topic()}-{name}").schema_id) for name in (TYPED, GENERIC)]
    assert [line["value"]["id"] for line in lines] == [e.id_str for e in events]
    assert lines[0]["value"]["payload"] == {"orderId": "o-1", "amount": 13.5, "step": 1}
    assert lines[1]["value"]["payload"] == {"amount": 12.5, "when": [1, None]}


# ---- the dev stack -----------------------------------------------------------------------------

def test_dev_up_with_schema_registry_prints_its_url_and_down_stops_it(tmp_path):
    from relay.dev.registry import APICURIO_VERSION, registry_home
    from relay.dev.stack import KAFKA_VERSION, cache_dir, pid_alive

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"kafka-{KAFKA_VERSION}").symlink_to(cache_dir() / f"kafka-{KAFKA_VERSION}")
    (cache / f"apicurio-registry-{APICURIO_VERSION}").symlink_to(registry_home())
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    environ |= {"RELAY_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}

    def dev(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "relay", "dev", *args], env=environ, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    pids: list[int] = []
    try:
        up = dev("up", "--schema-registry")
        state = json.JSONDecoder().raw_decode(up.stdout)[0]
        pids = [*state["mongodb"]["pids"], state["kafka"]["pid"], state["schema_registry"]["pid"]]
        url = state["schema_registry"]["url"]
        assert f"export RELAY_SCHEMA_REGISTRY_URL='{url}'" in up.stdout
        assert SchemaRegistryClient({"url": url}).get_subjects() == []
        down = json.loads(dev("down").stdout)
        assert sorted(down["stopped"]) == ["kafka", "mongod0", "schema-registry"]
        assert not any(pid_alive(pid) for pid in pids)
    finally:
        if (cache / "devstack.json").exists():
            dev("down")
        for pid in pids:  # only what this test started, by pid, if `down` could not stop it
            if pid_alive(pid):
                os.kill(pid, 9)

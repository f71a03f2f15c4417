"""`outbox-relay tail` against a real Kafka broker, for both framings.

The relay publishes through a real MongoDB and Kafka. Here the Confluent wire format is exercised
with confluent-kafka's mock Schema Registry client (`mock://` URL, shared by everything in this
process that uses the same URL), so that case runs tail in-process rather than as a command;
tests/integration/test_schema_registry.py runs `tail` as a command against a real registry server.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid

from confluent_kafka import Producer

from relay.avro.framing import registry_client
from relay.commands.tail import tail
from relay.outbox import Outbox, OutboxEvent
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import topic_size
from tests.support.waiting import wait_until

TYPED = "io.outboxrelay.v1.events.OrderCreated"
GENERIC = "io.outboxrelay.v1.OutboxEvent"


def publish_two_events(env, settings=None) -> list[OutboxEvent]:
    events = [OutboxEvent.new("order", "o-1", "OrderCreated", {"orderId": "o-1", "amount": 12.5, "step": 1},
                              headers={"traceparent": "00-abc"}),
              OutboxEvent.new("order", "o-1", "OrderPaid", {"amount": 12.5, "when": {"nested": [1, None]}})]
    Outbox(env.outbox).add_many(events)
    with RelayThread(settings or env.settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 2, 60, "two events")
    assert relay.error is None, relay.error
    return events


def run_tail(env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", "tail", *args], capture_output=True, text=True,
                          env=settings_env(env.settings), cwd=ROOT, timeout=120)


def test_tail_prints_each_message_decoded_with_its_headers_as_a_json_line(env):
    events = publish_two_events(env)
    result = run_tail(env, env.topic(), "--from-beginning")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["schema"] for line in lines] == [TYPED, GENERIC]
    typed, generic = lines
    assert typed["framing"] == "single-object" and typed["key"] == "o-1" and typed["topic"] == env.topic()
    assert typed["headers"]["ce_id"] == events[0].id_str and typed["headers"]["traceparent"] == "00-abc"
    assert typed["headers"]["relay_fencing_token"] == "1"
    assert typed["value"]["payload"] == {"orderId": "o-1", "amount": 12.5, "step": 1}
    assert typed["value"]["occurredAt"].endswith("Z") and typed["value"]["id"] == events[0].id_str
    assert generic["value"]["payload"] == {"amount": 12.5, "when": {"nested": [1, None]}}  # the Extended JSON, parsed
    assert len(typed["schemaRef"]) == 16  # the fingerprint, hex

    last = run_tail(env, env.topic(), "--last", "1")
    assert [json.loads(line)["schema"] for line in last.stdout.splitlines()] == [GENERIC]


def test_tail_reports_values_it_cannot_decode_and_goes_on(env):
    publish_two_events(env)
    with Producer({"bootstrap.servers": env.servers.kafka_bootstrap}) as producer:
        producer.produce(env.topic(), key=b"o-1", value=b"not avro")
        assert producer.flush(10) == 0
    lines = [json.loads(line) for line in run_tail(env, env.topic(), "--from-beginning").stdout.splitlines()]
    assert len(lines) == 3 and "neither Avro single-object" in lines[2]["error"]
    assert lines[2]["valueBase64"] == "bm90IGF2cm8="


def test_tail_of_a_missing_topic_exits_2(env):
    result = run_tail(env, env.topic("nothing"), "--from-beginning")
    assert result.returncode == 2 and "no topic" in result.stderr


def test_relay_with_a_registry_url_writes_the_confluent_wire_format_and_tail_decodes_it(env):
    settings = env.settings.replace(schema_registry_url=f"mock://tail-{uuid.uuid4().hex[:8]}")
    events = publish_two_events(env, settings)
    out = io.StringIO()
    assert tail(settings, env.topic(), from_beginning=True, out=out) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["framing"], line["schema"]) for line in lines] == [("confluent", TYPED), ("confluent", GENERIC)]
    assert lines[0]["value"]["payload"] == {"orderId": "o-1", "amount": 12.5, "step": 1}
    assert lines[1]["value"]["id"] == events[1].id_str
    client = registry_client(settings.schema_registry_url)
    assert sorted(client.get_subjects()) == sorted([f"{env.topic()}-{TYPED}", f"{env.topic()}-{GENERIC}"])
    assert {line["schemaRef"] for line in lines} == {
        str(client.get_latest_version(f"{env.topic()}-{name}").schema_id) for name in (TYPED, GENERIC)}

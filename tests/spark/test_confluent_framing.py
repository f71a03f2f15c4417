"""The pipeline jobs on values in the Confluent wire format (magic byte 0, 4-byte Schema Registry
id), beside single-object ones: writer schemas read from a real Schema Registry server (the
`schema_registry` fixture) once per id when the job starts."""

from __future__ import annotations

import datetime as dt
import io
import json

import fastavro
import pytest

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.avro.framing import MessageDecoder, registry_client
from relay.commands.status import reset_checkpoint
from relay.core.errors import EXIT_DATA, ServerUnreachableError
from relay.dev.stack import free_port
from relay.outbox import Outbox, OutboxEvent
from relay.spark import audit as audit_job
from relay.spark import materialize as materialize_job
from relay.spark.decode import decode_events
from relay.spark.schemas import RegistryAccess, with_registry_ids, writer_schemas
from tests.spark.support import (
    SPARK_FLAGS,
    VIEW_COLLECTION,
    assert_view_equals_outbox,
    mongo_view,
    outbox_state,
    parquet_view,
)
from tests.spark.test_decoding import KAFKA_ROW, SOURCE
from tests.spark.test_decoding import TYPED as ORDER_PLACED
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import Record, read_messages, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events

FOLDER = SchemaFolder.bundled()
WHEN = dt.datetime(2025, 3, 4, 5, 6, 7, 891000, tzinfo=dt.UTC)


def _confluent(schema_id: int, single_object: bytes) -> bytes:
    """The same Avro body in the Confluent wire format."""
    return b"\x00" + schema_id.to_bytes(4, "big") + single_object[10:]


def _generic(event_id: str) -> bytes:
    return FOLDER.encode(ENVELOPE, {"id": event_id, "aggregateType": "order", "aggregateId": "o-1",
                                    "eventType": "OrderPaid", "occurredAt": WHEN, "payload": '{"amount": 1}',
                                    "source": SOURCE})


# ---- decoding (no servers) ---------------------------------------------------------------------

def test_registry_ids_attach_to_the_folder_schema_of_the_same_fingerprint():
    not_an_event = json.dumps({"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]})
    schemas = with_registry_ids(writer_schemas(), {3: json.dumps(FOLDER.raw(ENVELOPE)), 4: not_an_event,
                                                   9: json.dumps(FOLDER.raw(ENVELOPE)),
                                                   5: json.dumps(ORDER_PLACED)})
    by_name = {s.name: s for s in schemas}
    assert by_name[ENVELOPE].confluent_ids == {3, 9}
    assert by_name[ENVELOPE].fingerprint == FOLDER.fingerprint(ENVELOPE)
    assert by_name["io.outboxrelay.v1.order.OrderPlaced"].confluent_ids == {5}  # only in the registry
    assert "Other" not in by_name and len(schemas) == len(writer_schemas()) + 1


def test_confluent_values_decode_to_the_same_rows_as_single_object_ones(spark):
    schemas = with_registry_ids(writer_schemas(), {7: json.dumps(FOLDER.raw(ENVELOPE)), 8: json.dumps(ORDER_PLACED)})
    body = io.BytesIO()  # OrderPlaced is only in the registry: its body written with fastavro
    fastavro.schemaless_writer(body, fastavro.parse_schema(ORDER_PLACED), {
        "id": "e3", "aggregateType": "order", "aggregateId": "o-1", "eventType": "OrderPlaced", "occurredAt": WHEN,
        "payload": {"orderId": "o-1", "amount": 2.5, "lines": ["a"]}, "source": SOURCE})
    rows = [(_generic("e1"), "t", 0, 0, WHEN, b"o-1", []),
            (_confluent(7, _generic("e1")), "t", 0, 1, WHEN, b"o-1", []),
            (b"\x00" + (8).to_bytes(4, "big") + body.getvalue(), "t", 0, 2, WHEN, b"o-1", [])]
    got = [r.asDict(recursive=True) for r in
           decode_events(spark.createDataFrame(rows, KAFKA_ROW), schemas).orderBy("offset").collect()]
    single, confluent, registry_only = got
    assert {k: v for k, v in single.items() if k != "offset"} == {k: v for k, v in confluent.items() if k != "offset"}
    assert (confluent["id"], confluent["writerSchema"], confluent["payload"]) == ("e1", ENVELOPE, '{"amount": 1}')
    assert registry_only["writerSchema"] == "io.outboxrelay.v1.order.OrderPlaced"
    assert json.loads(registry_only["payload"]) == {"orderId": "o-1", "amount": 2.5, "lines": ["a"]}


def test_an_unknown_schema_id_fails_the_decoding_naming_the_message_and_the_id(spark):
    schemas = with_registry_ids(writer_schemas(), {7: json.dumps(FOLDER.raw(ENVELOPE))})
    df = spark.createDataFrame([(_confluent(300, _generic("e1")), "orders", 1, 5, WHEN, b"k", [])], KAFKA_ROW)
    with pytest.raises(Exception, match=r"undecodable message orders\[1\]@5: no writer schema for Schema "
                                        r"Registry id 300 \(Confluent wire format\)"):
        decode_events(df, schemas).collect()
    [lenient] = decode_events(df, writer_schemas(), strict=False).collect()  # no registry given at all
    assert lenient["id"] is None and "Schema Registry id 300" in lenient["decodeError"]


def test_an_unreachable_registry_fails_the_job_at_start_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    with pytest.raises(ServerUnreachableError, match=f"Schema Registry at {url} \\(RELAY_SCHEMA_REGISTRY_URL\\)"):
        writer_schemas(registry=RegistryAccess(url))


# ---- the jobs on a relay's topic, against the server ------------------------------------------

def _records(env, url: str) -> list[Record]:
    """The topic, each value decoded from its framing (the oracle's positions and ids)."""
    decoder = MessageDecoder(FOLDER, registry_client(url))
    out = []
    for msg in read_messages(env.servers.kafka_bootstrap, env.topic()):
        decoded = decoder.decode(msg.value(), msg.topic())
        out.append(Record(msg.topic(), msg.partition(), msg.offset(), msg.key().decode(),
                          {**decoded.record, "framing": decoded.framing}, {}))
    return out


def test_materialize_and_audit_read_a_topic_written_in_both_framings_equal_to_the_outbox(
        env, spark, schema_registry, tmp_path, monkeypatch, capsys):
    """The relay publishes in single-object encoding, is restarted with the registry URL and goes
    on in the Confluent format, then replays everything (checkpoint reset) in the Confluent
    format: every event is in the topic in both framings, some twice. `materialize` (registry from
    RELAY_SCHEMA_REGISTRY_URL) and `audit` (from --schema-registry-url) see each event once."""
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    bootstrap, outbox = env.servers.kafka_bootstrap, Outbox(env.outbox)
    confluent = env.settings.replace(schema_registry_url=schema_registry.url)
    written = Written()

    def publish(settings, total: int, seed: int) -> None:
        before = topic_size(bootstrap, env.topic())
        typed = [OutboxEvent.new("order", f"typed-{i % 4}", "OrderCreated",
                                 {"orderId": f"typed-{i % 4}", "amount": 1.5 + i, "step": seed * 100 + i})
                 for i in range(12)]
        with RelayThread(settings) as relay:
            write_events(env.db, settings.outbox_collection, total=total, writers=2, seed=seed, written=written)
            outbox.add_many(typed)
            written.add(typed)
            wait_until(lambda: topic_size(bootstrap, env.topic()) >= before + total + 12, 60, "the events")
        assert relay.error is None, relay.error

    publish(env.settings, 120, seed=1)
    publish(confluent, 120, seed=2)
    reset_checkpoint(env.settings)
    with RelayThread(confluent):
        wait_until(lambda: topic_size(bootstrap, env.topic()) >= 2 * len(written.ids), 90, "the replay")
    records = _records(env, schema_registry.url)
    assert {r.event["framing"] for r in records} == {"single-object", "confluent"}
    assert {r.id for r in records if r.event["framing"] == "single-object"} < written.ids
    expected = outbox_state(env.outbox, [("order", written)])
    position_of = {r.id: r.position for r in records}

    for key, value in settings_env(env.settings).items():
        if key.startswith("RELAY_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("RELAY_SCHEMA_REGISTRY_URL", schema_registry.url)
    output = tmp_path / "out"
    assert materialize_job.main(["--output", str(output), "--once", "--view-collection", VIEW_COLLECTION,
                                 *SPARK_FLAGS]) == 0
    ids = [r["id"] for r in spark.read.parquet(str(output / "events")).select("id").collect()]
    assert len(ids) == len(set(ids)) == len(written.ids) and set(ids) == written.ids, "each event exactly once"
    assert_view_equals_outbox(mongo_view(env.db), expected, position_of)
    assert_view_equals_outbox(parquet_view(spark, str(output / "state")), expected, position_of)

    monkeypatch.delenv("RELAY_SCHEMA_REGISTRY_URL")
    report_path = tmp_path / "audit.json"
    argv = ["--since", since.isoformat(), "--json", str(report_path), *SPARK_FLAGS]
    assert audit_job.main([*argv, "--schema-registry-url", schema_registry.url]) == 0, capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["outbox"]["events"] == report["kafka"]["eventsInRange"] == len(written.ids)
    assert report["undecodable"]["count"] == 0 and report["missing"]["count"] == 0
    assert report["duplicates"]["count"] == len(written.ids), "the replay copied every event once"

    # Without the registry the Confluent values are reported undecodable, naming their ids.
    assert audit_job.main(argv) == EXIT_DATA  # the events only written in the Confluent format are missing
    report = json.loads(report_path.read_text())
    confluent_messages = sum(r.event["framing"] == "confluent" for r in records)
    assert report["undecodable"]["count"] == confluent_messages
    assert "Schema Registry id" in report["undecodable"]["sample"][0]["decodeError"]
    assert RegistryAccess.from_settings(confluent) == RegistryAccess(schema_registry.url)

"""`audit` on relay-produced topics: a clean run passes; a missing event, an out-of-order pair and
a stale writer's message, planted with the relay's own encoder, are each caught."""

from __future__ import annotations

import datetime as dt
import json

from relay.core.errors import EXIT_DATA
from relay.outbox import Outbox, OutboxEvent
from relay.spark import audit as audit_job
from relay.spark.audit import AuditConfig, audit
from relay.spark.decode import topic_pattern
from tests.spark.support import SPARK_FLAGS, produce, relay_headers, relay_value
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import write_events


def _publish(env, total: int):
    with RelayThread(env.settings):
        written = write_events(env.db, env.settings.outbox_collection, total=total, writers=2)
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= total, 60, f"{total} events")
    return written


def test_audit_passes_on_a_clean_relay_run(env, spark):
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    written = _publish(env, 1200)
    s = env.settings
    report = audit(spark, AuditConfig(
        s.mongodb_uri, s.database, s.outbox_collection, s.parts().encoding.fields, s.kafka_bootstrap_servers,
        (), topic_pattern(s.topic_template), since, dt.datetime.now(dt.UTC)))
    assert report["passed"] and report["failures"] == []
    assert report["outbox"]["events"] == report["kafka"]["eventsInRange"] == len(written.ids)
    for finding in ("missing", "orderViolations", "keysOnSeveralPartitions", "duplicates", "notInOutbox",
                    "fencingRegressions", "undecodable", "withoutFencingToken"):
        assert report[finding]["count"] == 0, (finding, report[finding])


def test_audit_catches_a_missing_event_an_out_of_order_pair_and_a_stale_fencing_token(env, spark, tmp_path,
                                                                                         monkeypatch, capsys):
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    _publish(env, 600)
    records = read_topic(env.servers.kafka_bootstrap, env.topic())
    outbox, topic = Outbox(env.outbox), env.topic()
    # 1. Missing: committed to the outbox, never published (the relay is stopped).
    missing = OutboxEvent.new("order", "planted-missing", "Created", {"n": 1})
    outbox.add(missing)
    # 2. Out of order: x1 then x2 committed for one key, published x2 first.
    x1 = OutboxEvent.new("order", "planted-order", "Created", {"n": 1})
    x2 = OutboxEvent.new("order", "planted-order", "Paid", {"n": 2})
    outbox.add(x1)
    outbox.add(x2)
    newest = max(r.position for r in records)
    pos1, pos2 = newest + "01", newest + "02"  # later than every real event, x1 before x2
    produce(env.servers.kafka_bootstrap, [
        {"topic": topic, "partition": 0, "key": b"planted-order", "value": relay_value(x2, env.settings, pos2),
         "headers": relay_headers(x2, 1)},
        {"topic": topic, "partition": 0, "key": b"planted-order", "value": relay_value(x1, env.settings, pos1),
         "headers": relay_headers(x1, 1)},
    ])
    # 3. A stale writer (fencing token 0, after token 1 on that partition) re-publishes an event.
    victim = next(r for r in records if r.partition == 1)
    stale = OutboxEvent.new("order", victim.key, victim.event["eventType"], json.loads(victim.event["payload"]),
                            event_id=victim.id, occurred_at=victim.event["occurredAt"])
    produce(env.servers.kafka_bootstrap, [
        {"topic": topic, "partition": 1, "key": victim.key.encode(),
         "value": relay_value(stale, env.settings, victim.position), "headers": relay_headers(stale, 0)}])
    stale_offset = max(r.offset for r in read_topic(env.servers.kafka_bootstrap, topic) if r.partition == 1)

    for key, value in settings_env(env.settings).items():
        if key.startswith("RELAY_"):
            monkeypatch.setenv(key, value)
    report_path = tmp_path / "audit.json"
    code = audit_job.main(["--since", since.isoformat(), "--json", str(report_path), *SPARK_FLAGS])
    summary = capsys.readouterr().out
    report = json.loads(report_path.read_text())

    assert code == EXIT_DATA, summary
    assert report["passed"] is False and report["failures"] == ["missing", "orderViolations"]
    assert [m["id"] for m in report["missing"]["sample"]] == [missing.id_str]
    assert report["orderViolations"]["count"] == 1
    violation = report["orderViolations"]["sample"][0]
    assert (violation["key"], violation["earlier"]["id"], violation["later"]["id"]) == \
        ("planted-order", x2.id_str, x1.id_str)
    assert report["fencingRegressions"]["count"] == 1
    regression = report["fencingRegressions"]["sample"][0]
    assert (regression["partition"], regression["offset"], regression["id"]) == (1, stale_offset, victim.id)
    assert (regression["fencingToken"], regression["highestEarlierToken"]) == (0, 1)
    assert report["duplicates"]["count"] == 1 and report["duplicates"]["sample"][0]["id"] == victim.id
    assert report["notInOutbox"]["count"] == 0 and report["keysOnSeveralPartitions"]["count"] == 0
    assert "result: FAIL (missing, orderViolations)" in summary and "planted-missing" in summary


def test_fencing_tokens_are_compared_per_key_when_several_outbox_partitions_share_a_kafka_partition(spark):
    """RELAY_PARTITIONS > 1: partition 0's writer (token 7) and partition 1's (token 2) interleave
    in one Kafka partition; neither is stale. A lower token after a higher one for the same key is."""
    from relay.spark.audit import fencing_regressions

    rows = [("t", 0, 0, "a", "e0", 7), ("t", 0, 1, "b", "e1", 2), ("t", 0, 2, "a", "e2", 7),
            ("t", 0, 3, "b", "e3", 2), ("t", 0, 4, "a", "e4", 6)]
    messages = spark.createDataFrame(
        [(*r, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) for r in rows],
        "topic string, partition int, offset long, key string, id string, fencingToken long, occurredAt timestamp")
    per_key = [(r["offset"], r["fencingToken"], r["highestEarlierToken"])
               for r in fencing_regressions(messages, per_key=True).collect()]
    per_partition = [r["offset"] for r in fencing_regressions(messages).collect()]
    assert per_key == [(4, 6, 7)]
    assert per_partition == [1, 3, 4]  # the single-lease reading of the same messages

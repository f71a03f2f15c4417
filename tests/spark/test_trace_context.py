"""Trace context end to end: a service's span -> the outbox document -> the Kafka headers
(`traceparent`/`tracestate` and CloudEvents' `ce_traceparent`/`ce_tracestate`) -> `tail` -> the
Spark event table's columns (docs/trace-context.md). Real MongoDB, Kafka and Spark; the service's
tracer is OpenTelemetry's SDK with an in-memory exporter."""

from __future__ import annotations

import json
import subprocess
import sys

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_span_id, format_trace_id

from relay.outbox import Outbox, OutboxEvent
from relay.spark.materialize import materialize
from tests.spark.support import materialize_config
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.topics import read_messages, topic_size
from tests.support.waiting import wait_until


def test_a_services_span_reaches_the_kafka_headers_tail_and_the_spark_event_table(env, spark, tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("order-service")
    outbox = Outbox(env.outbox)
    with tracer.start_as_current_span("place order") as span:
        traced = OutboxEvent.new("order", "o-1", "OrderCreated", {"orderId": "o-1", "amount": 1.0, "step": 1})
        outbox.add(traced)
    untraced = OutboxEvent.new("order", "o-2", "OrderCreated", {"orderId": "o-2", "amount": 2.0, "step": 1})
    outbox.add(untraced)  # no active span: no trace context
    trace_id, span_id = format_trace_id(span.get_span_context().trace_id), format_span_id(span.get_span_context().span_id)
    traceparent = f"00-{trace_id}-{span_id}-{int(span.get_span_context().trace_flags):02x}"
    assert traced.headers == {"traceparent": traceparent} and untraced.headers is None

    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 2, 60, "both events")
    messages = {m.key(): dict(m.headers()) for m in read_messages(env.servers.kafka_bootstrap, env.topic())}
    assert messages[b"o-1"]["traceparent"] == messages[b"o-1"]["ce_traceparent"] == traceparent.encode()
    assert "traceparent" not in messages[b"o-2"] and "ce_traceparent" not in messages[b"o-2"]

    tail = subprocess.run([sys.executable, "-m", "relay", "tail", env.topic(), "--from-beginning", "--max-messages", "2"],
                          env=settings_env(env.settings), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tail.returncode == 0, tail.stderr
    lines = {line["key"]: line for line in map(json.loads, tail.stdout.splitlines())}
    assert lines["o-1"]["trace"]["traceId"] == trace_id and lines["o-1"]["trace"]["spanId"] == span_id
    assert lines["o-2"]["trace"] is None

    output = tmp_path / "out"
    materialize(spark, materialize_config(env.settings, output))
    rows = {r["id"]: r for r in spark.read.parquet(str(output / "events")).select("id", "traceparent", "tracestate").collect()}
    assert rows[traced.id_str]["traceparent"] == traceparent
    assert rows[untraced.id_str]["traceparent"] is None

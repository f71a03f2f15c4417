"""OutboxEvent.new and the W3C trace context (relay.outbox.trace), without servers."""

from __future__ import annotations

import sys

from opentelemetry.sdk.trace import TracerProvider

from relay.outbox import OutboxEvent

TRACER = TracerProvider().get_tracer("test")


def test_without_an_active_span_nothing_is_recorded():
    assert OutboxEvent.new("order", "o-1", "Created", {}).headers is None
    assert OutboxEvent.new("order", "o-1", "Created", {}, headers={"x": "1"}).headers == {"x": "1"}


def test_the_active_span_is_recorded_and_explicit_headers_win():
    with TRACER.start_as_current_span("s") as span:
        event = OutboxEvent.new("order", "o-1", "Created", {}, headers={"x": "1"})
        chosen = OutboxEvent.new("order", "o-1", "Created", {}, headers={"traceparent": "mine"})
        off = OutboxEvent.new("order", "o-1", "Created", {}, trace_context=False)
    context = span.get_span_context()
    assert event.headers == {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}", "x": "1"}
    assert chosen.headers == {"traceparent": "mine"}
    assert off.headers is None


def test_without_opentelemetry_installed_nothing_changes(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry -> ImportError
    with TRACER.start_as_current_span("s"):
        assert OutboxEvent.new("order", "o-1", "Created", {}).headers is None

"""The service's W3C trace context, recorded in an outbox event's `headers` (docs/trace-context.md).

`OutboxEvent.new` calls `current_trace_headers()`: with the OpenTelemetry API installed (the
`otel` extra) and a span active, it returns `traceparent` (and `tracestate` when there is one)
as the configured propagator writes them (W3C Trace Context by default); without the API, or
without an active span, nothing. The relay copies both into the Kafka record's headers of the
same names and into CloudEvents' `ce_traceparent` / `ce_tracestate` (relay.core.message).
"""

from __future__ import annotations

from relay.core.message import TRACE_HEADERS


def current_trace_headers() -> dict[str, str]:
    """The active span's `traceparent` / `tracestate`, or {} (no OpenTelemetry, no span)."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {name: carrier[name] for name, _ in TRACE_HEADERS if name in carrier}

"""Encoding cost per event: generic vs typed envelopes, single-object vs Confluent framing.

Run: `.venv/bin/python -m bench.encoding [--events N] [--repeat R]`.

Measures the message builder as the relay's loop calls it for a batch of changes (the values the
change source hands over, relay.core.change.Change, read from raw change events):
`MessageBuilder.build_many` (the compiled encoder, relay._native) and `build` (the Python path)
for whatever it declines; beside it, the Python path alone (`native=False`: BSON decode of the full document, outbox parsing, topic and headers,
payload conversion, Avro encoding, framing, size check). In this process, no servers: the
Confluent framing (Python path only) uses confluent-kafka's mock registry client (after the first
event the serializer's subject and id are cached, as with a real registry). Each figure is the
best of R runs over the same N pre-built changes (the cases interleaved round by round), in CPU
microseconds of the encoding thread per event (median beside). Then the change source's one pass
over each raw change event that makes those values (relay.mongo.codecs.read_changes; beside it
read_in_python, what an install without relay._native uses), and the
parts of the Python path, measured alone: Extended JSON rendering of the payload (generic) and
BSON -> Avro conversion (typed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import bson
import fastavro
from bson import Binary, Decimal128, ObjectId, json_util
from bson.int64 import Int64
from bson.json_util import RELAXED_JSON_OPTIONS

from harness.changes import insert_change
from relay.avro.contract import ENVELOPE
from relay.avro.encoding import MessageBuilder
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.change import Change
from relay.mongo.codecs import read_changes, read_in_python
from relay.outbox import OutboxEvent, decode
from relay.wiring import message_builder

TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}
UTC = dt.UTC


def _demo_payload(i: int) -> dict[str, Any]:
    return {"orderId": f"ord-{i:08d}", "amount": 12.5 + i % 100, "step": 1}


def _order_payload(i: int) -> dict[str, Any]:
    """A realistic nested payload: 25 values of most BSON types."""
    return {
        "orderId": ObjectId(), "placedAt": dt.datetime(2026, 1, 2, 3, 4, 5, 678000, UTC),
        "total": Decimal128(f"{i % 1000}.95"), "currency": "EUR", "status": "NEW",
        "customer": {"id": f"c-{i % 977}", "email": "ada@example.com", "since": dt.datetime(1969, 7, 20, tzinfo=UTC),
                     "address": {"city": "Zürich", "zip": "8001"}},
        "lines": [{"sku": f"sku-{j}", "qty": j + 1, "price": Decimal128(f"{j}.50")} for j in range(3)],
        "tags": ["web", "promo"], "version": Int64(2**40 + i), "token": Binary(uuid.uuid4().bytes, 4),
    }


_DEC = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
ORDER_PLACED_PAYLOAD = {"type": "record", "name": "OrderPlacedPayload", "fields": [
    {"name": "orderId", "type": "string"},
    {"name": "placedAt", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "total", "type": _DEC},
    {"name": "currency", "type": "string"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "id", "type": "string"}, {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "since", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": "string"}]}}]}},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}, {"name": "price", "type": _DEC}]}}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "version", "type": "long"},
    {"name": "token", "type": {"type": "string", "logicalType": "uuid"}},
]}


def _registry() -> SchemaFolder:
    registry = SchemaFolder.bundled()
    generic = registry.raw(ENVELOPE)
    fields = json.loads(json.dumps(generic["fields"]))
    for f in fields:
        if f["name"] == "payload":
            f["type"] = ORDER_PLACED_PAYLOAD
        if f["name"] == "source":
            f["type"]["namespace"] = "io.outboxrelay.v1"
    registry.add({"type": "record", "name": "OrderPlaced", "namespace": "io.outboxrelay.bench",
                  "eventType": "OrderPlaced", "fields": fields})
    return registry


def _raw_changes(event_type: str, payload: Callable[[int], dict[str, Any]], n: int) -> list[Any]:
    """Raw insert change events, as a getMore reply holds them."""
    return [insert_change(OutboxEvent.new("order", f"o-{i}", event_type, payload(i)).to_document(), TOKEN,
                          clusterTime=bson.Timestamp(0x6B02209A, 1), wallTime=dt.datetime(2026, 1, 1, tzinfo=UTC))
            for i in range(n)]


def _changes(event_type: str, payload: Callable[[int], dict[str, Any]], n: int) -> list[Change]:
    """The values the change source hands the loop for those events."""
    changes, _ = read_changes(_raw_changes(event_type, payload, n))
    return changes


def as_the_loop_does(builder: MessageBuilder, changes: list[Any]) -> list[Any]:
    """The batch through the compiled encoder, the changes it declines through `build`."""
    built = builder.build_many(changes, 1)
    return [m if m is not None else builder.build(c, 1) for m, c in zip(built, changes, strict=True)]


def _best(fn: Callable[[], Any], n: int, repeat: int) -> tuple[float, float]:
    """(best, median) CPU microseconds of this thread per event over `repeat` runs of `fn` (which
    does n events). CPU time, not wall time: the figure is what encoding costs the relay's loop,
    and other processes on the machine barely move it."""
    runs = []
    for _ in range(repeat):
        started = time.thread_time()
        fn()
        runs.append((time.thread_time() - started) / n * 1e6)
    return min(runs), statistics.median(runs)


def _cases(registry: SchemaFolder) -> list[tuple[str, MessageBuilder, str, Callable[[int], dict[str, Any]]]]:
    single = message_builder(Settings(), registry)
    confluent = message_builder(Settings.load(env={"RELAY_SCHEMA_REGISTRY_URL": "mock://bench"}), registry)
    return [
        ("generic envelope, demo payload (3 fields)", single, "OrderPaid", _demo_payload),
        ("typed OrderCreated, same payload", single, "OrderCreated", _demo_payload),
        ("generic envelope, order payload (25 values, nested)", single, "OrderFlagged", _order_payload),
        ("typed OrderPlaced, same payload", single, "OrderPlaced", _order_payload),
        ("generic envelope, Confluent framing (mock registry)", confluent, "OrderFlagged", _order_payload),
        ("typed OrderPlaced, Confluent framing (mock registry)", confluent, "OrderPlaced", _order_payload),
    ]


def _builders(registry: SchemaFolder, n: int, repeat: int) -> None:
    """Each case as the loop builds it and by the Python path alone, rounds interleaved."""
    python = message_builder(Settings(), registry, native=False)
    prepared = []
    for label, builder, event_type, payload in _cases(registry):
        changes = _changes(event_type, payload, n)
        alone = python if builder.native else builder
        assert as_the_loop_does(builder, changes[:1]) == [alone.build(changes[0], 1)], label  # the same message
        prepared.append((label, builder, alone, changes, len(alone.build(changes[0], 1).value)))
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeat):  # round by round, so machine drift affects every case alike
        for label, builder, alone, changes, _size in prepared:
            def loop(builder: MessageBuilder = builder, changes: list[Any] = changes) -> None:
                as_the_loop_does(builder, changes)

            def python_path(alone: MessageBuilder = alone, changes: list[Any] = changes) -> None:
                for change in changes:
                    alone.build(change, 1)
            runs.setdefault((label, "loop"), []).append(_best(loop, n, 1)[0])
            runs.setdefault((label, "python"), []).append(_best(python_path, n, 1)[0])
    print(f"{'case':<56} {'loop us/ev':>10} {'median':>7} {'Python us/ev':>12} {'median':>7} {'value bytes':>12}")
    for label, _builder, _alone, _batch, size in prepared:
        fast, slow = runs[(label, "loop")], runs[(label, "python")]
        print(f"{label:<56} {min(fast):>10.1f} {statistics.median(fast):>7.1f} {min(slow):>12.1f} "
              f"{statistics.median(slow):>7.1f} {size:>12}")


def _parts(registry: SchemaFolder, n: int, repeat: int) -> None:
    """The change source's read pass, and the parts that differ between generic and typed, alone."""
    print("\nthe change source's pass over each raw change event (relay.mongo.codecs.read_changes), compiled "
          "and in Python (read_in_python: an install without relay._native):")
    for label, payload in (("demo payload (3 fields)", _demo_payload), ("order payload (25 values, nested)", _order_payload)):
        raw = _raw_changes("OrderPaid", payload, n)
        best, median = _best(lambda raw=raw: read_changes(raw), n, repeat)
        slow, slow_median = _best(lambda raw=raw: read_in_python(raw), n, repeat)
        print(f"{'read, ' + label:<56} {best:>9.2f} {median:>8.2f} {slow:>12.2f} {slow_median:>7.2f}")
    docs = [decode(c.document)["payload"] for c in _changes("x", _order_payload, n)]
    mapper = registry.writer_for("OrderPlaced").mapper
    assert mapper is not None
    converted = [mapper.convert(d) for d in docs]
    parsed = registry.schema("io.outboxrelay.bench.OrderPlaced")
    payload_schema = next(f for f in parsed["fields"] if f["name"] == "payload")["type"]
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("generic: payload -> relaxed Extended JSON (json_util)",
         lambda: [json_util.dumps(d, json_options=RELAXED_JSON_OPTIONS) for d in docs]),
        ("typed: payload BSON -> Avro datum (PayloadMapper)", lambda: [mapper.convert(d) for d in docs]),
        ("typed: Avro datum -> bytes (fastavro, payload only)",
         lambda: [fastavro.schemaless_writer(io.BytesIO(), payload_schema, c) for c in converted]),
    ]
    print("\nparts, order payload:")
    for label, fn in parts:
        best, median = _best(fn, n, repeat)
        print(f"{label:<56} {best:>9.1f} {median:>8.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    registry = _registry()
    print(f"encoding cost per event: CPU us per event, best (median) of {args.repeat} interleaved rounds x "
          f"{args.events} events; as the loop does (compiled encoder, Python for what it declines) and the Python "
          "path alone")
    print(f"Python {platform.python_version()}, fastavro {fastavro.__version__}, {platform.machine()}\n")
    _builders(registry, args.events, args.repeat)
    _parts(registry, args.events, args.repeat)


if __name__ == "__main__":
    main()

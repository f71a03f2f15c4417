"""The benchmark's outbox events: payload variants (size, generic or typed) and their factories.

A *variant* fixes what each event's payload is. The generic ones (event type `BenchEvent`,
no schema in `schemas/events/`) carry a payload document of about `payload_bytes` BSON bytes,
written by the relay as relaxed Extended JSON text in the generic envelope. The typed one uses
`OrderCreated`, which has a schema (`schemas/events/OrderCreated.avsc`), so the relay checks
and converts its payload (`orderId`, `amount`, `step`) by the BSON -> Avro mapping.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any

import bson

from bench.common import AGGREGATE_TYPE, AGGREGATES
from relay.outbox import OutboxEvent

TYPED_EVENT_TYPE = "OrderCreated"


def aggregate_id(seq: int) -> str:
    return f"agg-{seq % AGGREGATES:04d}"


@dataclass(frozen=True)
class Variant:
    """A payload variant: `key` names it in tables and JSON; `events` is its backlog size."""

    key: str
    label: str
    payload_bytes: int
    typed: bool
    events: int

    def factory(self) -> EventFactory:
        return EventFactory(self.payload_bytes, typed=self.typed)


class EventFactory:
    """Outbox events of one variant; `event(seq)` is deterministic in `seq` (aggregate, payload).

    The generic payload's filler is random base64 text, so lz4 cannot shrink it to nothing
    (real payloads compress somewhat; a run of one repeated letter would flatter the Kafka side).
    """

    def __init__(self, payload_bytes: int, typed: bool = False) -> None:
        self.typed = typed
        overhead = len(bson.encode({"seq": 0, "data": ""}))
        self.filler_chars = max(0, payload_bytes - overhead)
        self._pool = base64.b64encode(os.urandom(self.filler_chars * 3 + 4096)).decode()

    def payload(self, seq: int) -> dict[str, Any]:
        if self.typed:
            return {"orderId": aggregate_id(seq), "amount": 10.0 + seq % 1000 / 4, "step": 1}
        start = (seq * 7919) % (len(self._pool) - self.filler_chars)
        return {"seq": seq, "data": self._pool[start:start + self.filler_chars]}

    def event(self, seq: int) -> OutboxEvent:
        event_type = TYPED_EVENT_TYPE if self.typed else "BenchEvent"
        return OutboxEvent.new(AGGREGATE_TYPE, aggregate_id(seq), event_type, self.payload(seq))


def variants(events: int, payload_bytes: int, sizes: bool, typed: bool) -> list[Variant]:
    """The variants a run measures: the default one first, then (optionally) 2 KB, 20 KB, typed.

    Larger payloads get smaller backlogs (2 KB: events / 2, 20 KB: events / 5), so each variant
    writes at most about 400 MB into the oplog and takes about as long as the default. (At events
    / 10, 20 KB's 10,000 events drained in about 2 s and measured 0.68 of the bare relay on equal
    terms in one run, 0.96 on a shared backlog in the same run; 20,000 events: 0.97 over three rounds.)
    """
    out = [Variant("default", f"{payload_bytes} B generic", payload_bytes, False, events)]
    if sizes:
        out += [Variant("2kb", "2 KB generic", 2048, False, max(1, events // 2)),
                Variant("20kb", "20 KB generic", 20480, False, max(1, events // 5))]
    if typed:
        out.append(Variant("typed", f"typed {TYPED_EVENT_TYPE}", 0, True, events))
    return out

"""The inbox's throughput, both forms, beside two bare consumers doing the same writes (reported,
never asserted).

Run: as part of `make bench` (`python -m bench.run`; `--only-inbox` runs only this scenario,
`--no-inbox` skips it, `--inbox-events N`, `--inbox-rounds R`), or alone:
`.venv/bin/python -m bench.scenarios.inbox [--events 20000] [--per-event-events 3000]
[--rounds 3] [--batch 500]` (a local stack of its own in a temporary folder, stopped and deleted at
the end; `--mongodb-uri` / `--bootstrap` use running servers instead).

One topic (3 partitions) holds `--events` events in the relay's format (generic envelope, single
object encoding, built by the relay's own message builder, 1,000 aggregates). Each consumer reads
it from the beginning in a group of its own, decodes every message with the inbox's decoder and
does one `update_one` (`$inc` on the aggregate's counter document, upsert) per event:

- `inbox`: `Inbox.run` with that handler (record lookup + records + the writes, one transaction
  per batch of at most `--batch`, offsets committed after);
- `async inbox`: `AsyncInbox.run` with the same handler as an `async def` over an
  AsyncMongoClient, in an event loop (Kafka on the inbox's own thread);
- `bare, one transaction per batch`: a confluent-kafka consumer (read_committed, manual commits),
  the same writes in one `with_transaction` per polled batch, no inbox records, offsets after;
- `bare, one transaction per event`: the same, one transaction per event (on the first
  `--per-event-events` events only: it is slow).

All four are timed over the same window: from the first handler call to the return of the
offset commit that covers the last event (the group join before, and closing the consumer after,
are left out of all four; the inboxes' commits are timed by a subclass of their consumer). The
order of the four is rotated every round (3 rounds by default); the ratios are of the medians.
Goals (issue 27): inbox >= 0.7 of the bare batched consumer, >= 10x the per-event one; (issue 35)
async inbox >= 0.9 of the inbox.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from unittest import mock

from confluent_kafka import Consumer, Producer, TopicPartition
from pymongo import AsyncMongoClient, MongoClient
from pymongo.client_session import ClientSession

from bench.common import create_topic, progress, warm_up_kafka
from bench.scenarios.outbox_writer import format_writer
from harness.changes import change_value
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.inbox import AsyncInbox, Inbox, InboxEvent
from relay.inbox import sources as sources_module
from relay.inbox.consumer import KafkaSource
from relay.inbox.decoding import EventDecoder, header_dict
from relay.outbox import OutboxEvent
from relay.wiring import message_builder

TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}
AGGREGATES = 1000
INBOX = "inbox"
ASYNC_INBOX = "async inbox"
BATCHED = "bare, one transaction per batch"
PER_EVENT = "bare, one transaction per event"


def fill_topic(bootstrap: str, topic: str, events: int) -> None:
    """`events` messages as the relay writes them, keyed by aggregate."""
    create_topic(bootstrap, topic)
    builder = message_builder(Settings(), SchemaFolder.bundled())
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": "20", "enable.idempotence": "true"})
    for i in range(events):
        agg = f"agg-{i % AGGREGATES}"
        doc = OutboxEvent.new("order", agg, "Changed", {"seq": i // AGGREGATES, "note": "x" * 40},
                              trace_context=False).to_document()
        msg = builder.build(change_value(doc, TOKEN), 1)
        producer.produce(topic, msg.value, msg.key, headers=msg.headers)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(60) > 0:
        raise RuntimeError("could not fill the topic")


class Window:
    """The timed window: the first handler call, and the last offset commit that returned."""

    def __init__(self) -> None:
        self.first = 0.0
        self.last_commit = 0.0

    def handler(self, db: Any) -> Callable[[InboxEvent, ClientSession], None]:
        def handle(event: InboxEvent, session: ClientSession) -> None:
            if not self.first:
                self.first = time.perf_counter()
            db.counts.update_one({"_id": event.aggregate_id}, {"$inc": {"n": 1}}, upsert=True, session=session)
        return handle

    def async_handler(self, db: Any) -> Callable[[InboxEvent, Any], Any]:
        async def handle(event: InboxEvent, session: Any) -> None:
            if not self.first:
                self.first = time.perf_counter()
            await db.counts.update_one({"_id": event.aggregate_id}, {"$inc": {"n": 1}}, upsert=True, session=session)
        return handle

    def timed_source(self) -> type[KafkaSource]:
        """The inboxes' consumer, noting when each offset commit returned."""
        window = self

        class TimedSource(KafkaSource):
            def commit(self, offsets: dict[tuple[str, int], int]) -> bool:
                done = super().commit(offsets)
                if offsets:
                    window.last_commit = time.perf_counter()
                return done

        return TimedSource

    def rate(self, events: int) -> float:
        return events / (self.last_commit - self.first)


def run_inbox(db: Any, bootstrap: str, topic: str, events: int, batch: int) -> float:
    window, group = Window(), f"bench-inbox-{uuid.uuid4().hex[:6]}"
    inbox = Inbox(db[f"inbox_{uuid.uuid4().hex[:6]}"])
    labels = {"group": group, "topic": topic}

    def watch() -> None:  # stops the inbox once every event is applied (its window ends before)
        while (inbox.registry.get_sample_value("relay_inbox_events_processed_total", labels) or 0) < events:
            time.sleep(0.01)
        inbox.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with mock.patch.object(sources_module, "KafkaSource", window.timed_source()):
        inbox.run(window.handler(db), topics=[topic], group_id=group, bootstrap_servers=bootstrap,
                  batch_max_events=batch)
    watcher.join()
    return window.rate(events)


def run_async_inbox(uri: str, database: str, bootstrap: str, topic: str, events: int, batch: int) -> float:
    """`AsyncInbox.run` in an event loop, the same handler awaited, the same window."""
    window, group = Window(), f"bench-async-inbox-{uuid.uuid4().hex[:6]}"
    labels = {"group": group, "topic": topic}

    async def main() -> None:
        client: AsyncMongoClient[Any] = AsyncMongoClient(uri, tz_aware=True)
        db = client[database]
        inbox = AsyncInbox(db[f"inbox_{uuid.uuid4().hex[:6]}"])

        async def watch() -> None:  # stops the inbox once every event is applied (its window ends before)
            while (inbox.registry.get_sample_value("relay_inbox_events_processed_total", labels) or 0) < events:
                await asyncio.sleep(0.01)
            inbox.stop()

        watcher = asyncio.create_task(watch())
        try:
            with mock.patch.object(sources_module, "KafkaSource", window.timed_source()):
                await inbox.run(window.async_handler(db), topics=[topic], group_id=group, bootstrap_servers=bootstrap,
                                batch_max_events=batch)
        finally:
            watcher.cancel()
            await client.close()

    asyncio.run(main())
    return window.rate(events)


def run_bare(db: Any, bootstrap: str, topic: str, events: int, batch: int, per_event: bool) -> float:
    """A consumer without an inbox: the same decoding and writes, offsets committed after them."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-bare-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": "false",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    decoder, window = EventDecoder(), Window()
    handle = window.handler(db)
    done = 0
    with db.client.start_session() as session:
        while done < events:
            msgs = [m for m in consumer.consume(min(batch, events - done), 0.2) if m.error() is None]
            if not msgs:
                continue
            decoded = [decoder.decode(m.topic(), m.partition(), m.offset(), m.value(), header_dict(m.headers()))
                       for m in msgs]
            groups = [[e] for e in decoded] if per_event else [decoded]
            for group in groups:
                session.with_transaction(lambda s, g=group: [handle(e, s) for e in g])
            offsets: dict[tuple[str, int], int] = {}
            for m in msgs:
                offsets[(m.topic(), m.partition())] = m.offset() + 1
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
            window.last_commit = time.perf_counter()
            done += len(msgs)
    consumer.close()
    return window.rate(done)


def inbox_scenario(uri: str, bootstrap: str, events: int = 20000, per_event_events: int = 3000, rounds: int = 3,
                   batch: int = 500) -> dict[str, Any]:
    """Fill a topic, then time the three consumers `rounds` times in a rotated order; the results
    (Kafka warmed up by the caller)."""
    topic = f"bench.inbox.{uuid.uuid4().hex[:6]}"
    progress(f"[inbox] writing {events} events to {topic}")
    fill_topic(bootstrap, topic, events)
    client: MongoClient[Any] = MongoClient(uri, tz_aware=True)
    contestants: list[tuple[str, Callable[[Any], float]]] = [
        (INBOX, lambda db: run_inbox(db, bootstrap, topic, events, batch)),
        (ASYNC_INBOX, lambda db: run_async_inbox(uri, db.name, bootstrap, topic, events, batch)),
        (BATCHED, lambda db: run_bare(db, bootstrap, topic, events, batch, False)),
        (PER_EVENT, lambda db: run_bare(db, bootstrap, topic, min(per_event_events, events), batch, True)),
    ]
    runs: dict[str, list[float]] = {name: [] for name, _ in contestants}
    load = [os.getloadavg()]
    try:
        for r in range(rounds):
            for name, run in contestants[r % len(contestants):] + contestants[: r % len(contestants)]:
                db = client[f"bench_inbox_{uuid.uuid4().hex[:6]}"]
                db.create_collection("counts")
                progress(f"[inbox] round {r + 1}/{rounds}: {name}")
                runs[name].append(run(db))
                client.drop_database(db.name)
    finally:
        client.close()
    load.append(os.getloadavg())
    median = {name: statistics.median(v) for name, v in runs.items()}
    return {"events": events, "per_event_events": min(per_event_events, events), "rounds": rounds, "batch": batch,
            "runs": runs, "events_per_s": median, "load_average": load,
            "inbox_vs_batched": median[INBOX] / median[BATCHED], "inbox_vs_per_event": median[INBOX] / median[PER_EVENT],
            "async_vs_sync": median[ASYNC_INBOX] / median[INBOX]}


def format_inbox(result: dict[str, Any]) -> list[str]:
    """The scenario's lines: events/s (median and each round's) and the ratios with their goals."""
    if not result:
        return []
    lines = [f"inbox: {result['events']} events ({result['per_event_events']} for one transaction per event), "
             f"batches of {result['batch']}, {result['rounds']} rounds in rotated order, medians; "
             "timed from the first handler call to the last offset commit"]
    for name, value in result["events_per_s"].items():
        runs = ", ".join(f"{x:.0f}" for x in result["runs"][name])
        lines.append(f"  {name:<34} {value:>9.0f} events/s   (rounds: {runs})")
    lines.append(f"  inbox / bare batched   = {result['inbox_vs_batched']:.2f}   (goal >= 0.7)")
    lines.append(f"  inbox / bare per event = {result['inbox_vs_per_event']:.1f}x  (goal >= 10x)")
    if "async_vs_sync" in result:
        lines.append(f"  async inbox / inbox    = {result['async_vs_sync']:.2f}   (goal >= 0.9)")
    start, end = result["load_average"]
    lines.append(f"  load average (1 min) at start {start[0]:.2f}, at end {end[0]:.2f}")
    return lines + format_writer(result.get("writer", {}))  # bench.run adds the async writer's overhead


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.mongodb_uri and args.bootstrap:  # servers of the caller's
        warm_up_kafka(args.bootstrap)
        result = inbox_scenario(args.mongodb_uri, args.bootstrap, args.events, args.per_event_events, args.rounds,
                                args.batch)
    else:
        from bench.stack import bench_stack

        with bench_stack() as (stack, _client):
            result = inbox_scenario(stack.mongo.uri, stack.kafka.bootstrap_servers, args.events,
                                    args.per_event_events, args.rounds, args.batch)
    print("\n".join(format_inbox(result)))
    print(json.dumps(result))
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.inbox", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--per-event-events", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--mongodb-uri", default="")
    parser.add_argument("--bootstrap", default="")
    args = parser.parse_args(argv)
    if args.events < 1 or args.per_event_events < 1 or args.rounds < 1 or args.batch < 1:
        parser.error("--events, --per-event-events, --rounds and --batch must be at least 1")
    return args


if __name__ == "__main__":
    sys.exit(main())

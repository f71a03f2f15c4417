"""The inbox's throughput beside two bare consumers doing the same writes (reported, never asserted).

Run: `.venv/bin/python -m bench.scenarios.inbox [--events 20000] [--per-event-events 3000]
[--rounds 1] [--batch 500]` (a local stack of its own in a temporary folder, stopped by pid and
deleted at the end; `--mongodb-uri` / `--bootstrap` use running servers instead).

One topic (3 partitions) holds `--events` events in the relay's format (generic envelope, single
object encoding, built by the relay's own message builder, 1,000 aggregates). Each consumer reads
it from the beginning in a group of its own, decodes every message with the inbox's decoder and
does one `update_one` (`$inc` on the aggregate's counter document, upsert) per event:

- `inbox`: `Inbox.run` with that handler (record lookup + records + the writes, one transaction
  per batch of at most `--batch`, offsets committed after);
- `bare, one transaction per batch`: a confluent-kafka consumer (read_committed, manual commits),
  the same writes in one `with_transaction` per polled batch, no inbox records, offsets after;
- `bare, one transaction per event`: the same, one transaction per event (on the first
  `--per-event-events` events only: it is slow).

Events/s are counted from the first event handled to the last offset commit (the group join is
left out). The order of the three is rotated every round; the ratios are of the medians.
Goals (issue 27): inbox >= 0.7 of the bare batched consumer, >= 10x the per-event one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from pymongo import MongoClient
from pymongo.client_session import ClientSession

from bench.common import create_topic, progress, warm_up_kafka
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.inbox import Inbox, InboxEvent
from relay.inbox.decoding import EventDecoder, header_dict
from relay.mongo.codecs import change_value
from relay.outbox import OutboxEvent
from relay.wiring import message_builder

TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}
AGGREGATES = 1000


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


def _update(db: Any) -> Callable[[InboxEvent, ClientSession], None]:
    def handle(event: InboxEvent, session: ClientSession) -> None:
        db.counts.update_one({"_id": event.aggregate_id}, {"$inc": {"n": 1}}, upsert=True, session=session)
    return handle


def run_inbox(db: Any, bootstrap: str, topic: str, events: int, batch: int) -> float:
    inbox = Inbox(db[f"inbox_{uuid.uuid4().hex[:6]}"])
    handle = _update(db)
    first: list[float] = []

    def counted(event: InboxEvent, session: ClientSession) -> None:
        if not first:
            first.append(time.perf_counter())
        handle(event, session)

    def watch() -> None:
        while (inbox.registry.get_sample_value("relay_inbox_events_processed_total", {"topic": topic}) or 0) < events:
            time.sleep(0.01)
        first.append(time.perf_counter())
        inbox.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    inbox.run(counted, topics=[topic], group_id=f"bench-inbox-{uuid.uuid4().hex[:6]}", bootstrap_servers=bootstrap,
              batch_max_events=batch)
    watcher.join()
    return events / (first[-1] - first[0])


def run_bare(db: Any, bootstrap: str, topic: str, events: int, batch: int, per_event: bool) -> float:
    """A consumer without an inbox: the same decoding and writes, offsets committed after them."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-bare-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": "false",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    decoder, handle = EventDecoder(), _update(db)
    done, started = 0, 0.0
    with db.client.start_session() as session:
        while done < events:
            msgs = [m for m in consumer.consume(min(batch, events - done), 0.2) if m.error() is None]
            if not msgs:
                continue
            started = started or time.perf_counter()
            decoded = [decoder.decode(m.topic(), m.partition(), m.offset(), m.value(), header_dict(m.headers()))
                       for m in msgs]
            groups = [[e] for e in decoded] if per_event else [decoded]
            for group in groups:
                session.with_transaction(lambda s, g=group: [handle(e, s) for e in g])
            offsets: dict[tuple[str, int], int] = {}
            for m in msgs:
                offsets[(m.topic(), m.partition())] = m.offset() + 1
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
            done += len(msgs)
    seconds = time.perf_counter() - started
    consumer.close()
    return done / seconds


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    stack = None
    uri, bootstrap = args.mongodb_uri, args.bootstrap
    if not (uri and bootstrap):
        from relay.dev.stack import LocalStack

        stack = LocalStack.in_temp_dir()
        stack.start()
        uri, bootstrap = stack.mongo.uri, stack.kafka.bootstrap_servers
    try:
        return _measure(args, uri, bootstrap)
    finally:
        if stack is not None:
            stack.stop()
            shutil.rmtree(stack.base_dir, ignore_errors=True)


def _measure(args: argparse.Namespace, uri: str, bootstrap: str) -> int:
    warm_up_kafka(bootstrap)
    topic = f"bench.inbox.{uuid.uuid4().hex[:6]}"
    progress(f"writing {args.events} events to {topic}")
    fill_topic(bootstrap, topic, args.events)
    client: MongoClient[Any] = MongoClient(uri, tz_aware=True)
    contestants: list[tuple[str, Callable[[Any], float]]] = [
        ("inbox", lambda db: run_inbox(db, bootstrap, topic, args.events, args.batch)),
        ("bare, one transaction per batch", lambda db: run_bare(db, bootstrap, topic, args.events, args.batch, False)),
        ("bare, one transaction per event",
         lambda db: run_bare(db, bootstrap, topic, min(args.per_event_events, args.events), args.batch, True)),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _ in contestants}
    for r in range(args.rounds):
        for name, run in contestants[r % 3:] + contestants[: r % 3]:
            db = client[f"bench_inbox_{uuid.uuid4().hex[:6]}"]
            db.create_collection("counts")
            progress(f"round {r + 1}: {name}")
            rates[name].append(run(db))
            client.drop_database(db.name)
    median = {name: statistics.median(v) for name, v in rates.items()}
    for name, value in median.items():
        print(f"{name:<34} {value:>9.0f} events/s   (runs: {', '.join(f'{x:.0f}' for x in rates[name])})")
    vs_batched = median["inbox"] / median["bare, one transaction per batch"]
    vs_per_event = median["inbox"] / median["bare, one transaction per event"]
    print(f"inbox / bare batched   = {vs_batched:.2f}   (goal >= 0.7)")
    print(f"inbox / bare per event = {vs_per_event:.1f}x  (goal >= 10x)")
    print(json.dumps({"events": args.events, "events_per_s": median, "inbox_vs_batched": vs_batched,
                      "inbox_vs_per_event": vs_per_event}))
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.inbox", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--per-event-events", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--mongodb-uri", default="")
    parser.add_argument("--bootstrap", default="")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())

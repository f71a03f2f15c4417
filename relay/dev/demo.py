"""`outbox-relay demo`: the whole path on one machine.

With no servers configured (RELAY_MONGODB_URI and RELAY_KAFKA_BOOTSTRAP_SERVERS, or with
RELAY_BROKER=nats RELAY_NATS_SERVERS, or with RELAY_BROKER=rabbitmq RELAY_RABBITMQ_URL, unset) it
starts the local stack in a temporary folder: MongoDB and the broker (`--broker nats`: nats-server
with JetStream; `--broker rabbitmq`: rabbitmq-server). Then a demo service writes orders and their
outbox events in transactions, the relay publishes them, a consumer prints each decoded event with a
progress line, and a shipping service consumes them through the inbox (relay.inbox). On RabbitMQ
the demo declares its queues before the relay starts, bound to the exchange with the orders' routing
key: the printer's (exclusive to its connection, gone with it) and the shipping service's
(`demo-shipping`, a quorum queue with a single active consumer, which its inbox then consumes).
`--events N` stops after N distinct events arrived: then the relay's checkpoint is reset and the
relay publishes every event again: on Kafka and RabbitMQ the shipping service's inbox skips them as
duplicates; on NATS the stream itself drops them (Nats-Msg-Id within its duplicate window). The
effects and those figures are printed. Ctrl-C stops earlier. Everything the demo started is stopped
on the way out.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from pymongo import MongoClient
from pymongo.database import Database

from relay.avro.folder import SchemaFolder
from relay.commands.message_json import to_json
from relay.config import Settings
from relay.inbox import Inbox, InboxEvent
from relay.outbox import FieldNames, Outbox, OutboxEvent

_FLOW = ["OrderCreated", "OrderPaid", "OrderShipped"]


class DemoService:
    """A tiny order service: each transaction writes an order and one to three outbox events."""

    def __init__(self, db: Database[Any], outbox_collection: str, fields: FieldNames | None = None) -> None:
        self.db = db
        self.outbox = Outbox(db[outbox_collection], fields or FieldNames())
        self.written = 0

    def write_order(self, rng: random.Random, at_most: int = len(_FLOW)) -> int:
        """One order and its first one to three events (no more than `at_most`), in one transaction."""
        order_id = f"ord-{uuid.uuid4().hex[:10]}"
        steps = _FLOW[: min(rng.randint(1, 3), at_most)]
        amount = round(rng.uniform(5, 500), 2)
        with self.db.client.start_session() as session, session.start_transaction():
            self.db.orders.insert_one({"_id": order_id, "amount": amount, "status": steps[-1]}, session=session)
            self.outbox.add_many(
                [
                    OutboxEvent.new("order", order_id, step, {"orderId": order_id, "amount": amount, "step": i + 1})
                    for i, step in enumerate(steps)
                ],
                session=session,
            )
        self.written += len(steps)
        return len(steps)

    def run(self, stop: threading.Event, rate: float, limit: int | None, seed: int = 7) -> None:
        rng = random.Random(seed)
        started = time.monotonic()
        while not stop.is_set() and (limit is None or self.written < limit):
            self.write_order(rng, len(_FLOW) if limit is None else limit - self.written)
            ahead = self.written / rate - (time.monotonic() - started)
            if ahead > 0:
                stop.wait(ahead)


class ShippingService:
    """A downstream service consuming the orders through the inbox (relay.inbox): each order's
    shipment document lists the order's steps, each applied exactly once, in order, however
    often the relay delivers it."""

    GROUP = "demo-shipping"
    QUEUE = "demo-shipping"  # on RabbitMQ: the queue its inbox consumes (declared by the demo first)

    def __init__(self, db: Database[Any], settings: Settings, topic: str) -> None:
        self.db = db
        self.inbox = Inbox(db.demo_inbox)
        self.topic = topic
        self.run_options: dict[str, Any] = {
            "topics": [topic],
            "group_id": self.GROUP,
            # The relay's Schema Registry, when it writes the Confluent wire format.
            "schema_registry_url": settings.schema_registry_url,
            "schema_registry_basic_auth": settings.schema_registry_basic_auth,
        }
        if settings.broker == "nats":
            self.run_options |= {"nats_servers": settings.nats_servers, "nats_stream": settings.nats_stream,
                                 "nats_user": settings.nats_user, "nats_password": settings.nats_password,
                                 "nats_token": settings.nats_token, "nats_creds": settings.nats_creds,
                                 "nats_tls_ca": settings.nats_tls_ca}  # fmt: skip
        elif settings.broker == "rabbitmq":
            self.run_options |= {"topics": [self.QUEUE], "rabbitmq_url": settings.rabbitmq_url,
                                 "rabbitmq_exchange": settings.rabbitmq_exchange,
                                 "rabbitmq_tls_ca": settings.rabbitmq_tls_ca, "rabbitmq_bindings": [topic]}  # fmt: skip
        else:
            kafka = {k: v for k, v in settings.kafka_client_config().items() if k != "bootstrap.servers"}
            self.run_options |= {"bootstrap_servers": settings.kafka_bootstrap_servers, "kafka": kafka}

    def handle(self, event: InboxEvent, session: Any) -> None:
        self.db.shipments.update_one(
            {"_id": event.aggregate_id},
            {"$push": {"steps": event.event_type}, "$set": {"amount": event.payload.get("amount")}},
            upsert=True,
            session=session,
        )

    def run(self) -> None:
        self.inbox.run(self.handle, **self.run_options)

    def count(self, metric: str) -> int:
        return int(self.inbox.registry.get_sample_value(metric, {"group": self.GROUP, "topic": self.topic}) or 0)

    def wait(self, metric: str, at_least: int, timeout_s: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count(metric) < at_least and time.monotonic() < deadline and not stop.is_set():
            stop.wait(0.1)

    def summary(self) -> str:
        shipments = list(self.db.shipments.find().sort("_id").limit(3))
        lines = [f"shipping: {s['_id']} steps={s['steps']} amount={s.get('amount')}" for s in shipments]
        applied = self.count("relay_inbox_events_processed_total")
        skipped = self.count("relay_inbox_duplicates_skipped_total")
        total = self.db.shipments.count_documents({})
        lines.append(
            f"shipping service (inbox): {applied} events applied to {total} shipments, {skipped} duplicates skipped"
        )
        return "\n".join(lines)


def _replay(
    settings: Settings,
    relay: Any,
    shipping: ShippingService,
    events: int,
    stop: threading.Event,
    threads: list[threading.Thread],
) -> Any:
    """Show the inbox at work: reset the relay's checkpoint, so it publishes every event again at
    new offsets (what a crash does to the events after the checkpoint); the inbox skips them."""
    from relay.commands.status import reset_checkpoint
    from relay.wiring import build

    shipping.wait("relay_inbox_events_processed_total", events, 60, stop)
    relay.stop()
    print("demo: resetting the relay's checkpoint: it publishes every event again", file=sys.stderr, flush=True)
    reset_checkpoint(settings, force=True)
    replayed = build(settings.replace(http_port=0))
    thread = threading.Thread(target=replayed.run, name="relay-replay", daemon=True)
    thread.start()
    threads.append(thread)
    if settings.broker == "nats":
        _wait_published(replayed, events, 60, stop)
        print(f"demo: the relay published all {events} events again; stream {settings.nats_stream} holds "
              f"{stream_messages(settings)} messages: it dropped every copy (Nats-Msg-Id within its duplicate "
              "window)", file=sys.stderr, flush=True)  # fmt: skip
    else:
        shipping.wait("relay_inbox_duplicates_skipped_total", events, 60, stop)
    return replayed


def _wait_published(relay: Any, at_least: int, timeout_s: float, stop: threading.Event) -> None:
    """Until `relay` (a Group) had `at_least` events acknowledged by the broker."""
    registry = relay.observer.metrics.registry
    deadline = time.monotonic() + timeout_s

    def published() -> float:
        return float(sum(s.value for f in registry.collect() if f.name == "relay_events_published"
                         for s in f.samples if s.name.endswith("_total")))  # fmt: skip

    while published() < at_least and time.monotonic() < deadline and not stop.is_set():
        stop.wait(0.1)


def stream_messages(settings: Settings) -> int:
    """How many messages RELAY_NATS_STREAM holds."""
    import asyncio

    from relay.nats.client import connect

    async def count() -> int:
        connection = await connect(settings.parts().nats)
        try:
            return int((await connection.jetstream().stream_info(settings.nats_stream)).state.messages)
        finally:
            await connection.close()

    return asyncio.run(count())


def _json_text(payload: Any) -> str:
    """The payload as JSON text: as carried for the generic envelope, encoded for a typed one."""
    return payload if isinstance(payload, str) else json.dumps(to_json(payload))


def _print_event(where: str, event: dict[str, Any], headers: dict[str, str]) -> None:
    print(
        f"{where} {event['aggregateId']} {event['eventType']:<13} id={event['id']} "
        f"fencing={headers.get('relay_fencing_token')} payload={_json_text(event['payload'])}",
        flush=True,
    )


class _Progress:
    """The progress line: events received so far and their rate (in place on a terminal)."""

    def __init__(self, want: int | None) -> None:
        self.want, self.tty = want, sys.stderr.isatty()
        self.started = self.last = time.monotonic()

    def show(self, seen: int) -> None:
        now = time.monotonic()
        if now - self.last >= (0.2 if self.tty else 2.0):
            self.last = now
            rate = seen / max(now - self.started, 1e-9)
            line = f"received {seen}{'/' + str(self.want) if self.want else ''} events, {rate:.0f}/s"
            print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)


def _nats_printer(
    registry: SchemaFolder, settings: Settings, subject: str, want: int | None, stop: threading.Event
) -> int:
    """The stream's messages on `subject`, from its first, decoded and printed (an ephemeral
    consumer that acknowledges nothing)."""
    import asyncio

    from nats.js.api import AckPolicy, ConsumerConfig

    from relay.nats.client import connect

    seen: set[str] = set()
    progress = _Progress(want)

    async def read() -> None:
        connection = await connect(settings.parts().nats)
        try:
            sub = await connection.jetstream().pull_subscribe(
                subject, stream=settings.nats_stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
            )
            while not stop.is_set() and (want is None or len(seen) < want):
                try:
                    batch = await sub.fetch(100, timeout=0.5)
                except TimeoutError:  # nats-py's and asyncio's: nothing within the wait
                    batch = []
                for msg in batch:
                    event = registry.decode(msg.data)
                    seen.add(event["id"])
                    _print_event(f"{msg.subject}#{msg.metadata.sequence.stream}", event, dict(msg.headers or {}))
                progress.show(len(seen))
        finally:
            await connection.close()

    asyncio.run(read())
    return len(seen)


class RabbitQueues:
    """The demo's queues on RabbitMQ, declared before the relay starts (a message no queue takes
    would stop it) and bound to the exchange with the orders' routing key: the printer's, exclusive
    to this connection (RabbitMQ deletes it with the connection), and the shipping service's, a
    quorum queue with a single active consumer, as its inbox declares it."""

    def __init__(self, settings: Settings, topic: str) -> None:
        import pika

        from relay.inbox.rabbitmq import QUEUE_ARGUMENTS
        from relay.rabbitmq.client import parameters

        config = settings.parts().rabbitmq
        self.connection = pika.BlockingConnection(parameters(config))
        self.channel = ch = self.connection.channel()
        self.queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(self.queue, config.exchange, topic)
        ch.queue_declare(ShippingService.QUEUE, durable=True, arguments=QUEUE_ARGUMENTS)
        ch.queue_bind(ShippingService.QUEUE, config.exchange, topic)

    def stop(self) -> None:
        """Close the connection (RabbitMQ deletes the printer's queue with it)."""
        if self.connection.is_open:
            self.connection.close()


def _rabbitmq_printer(registry: SchemaFolder, queues: RabbitQueues, want: int | None, stop: threading.Event) -> int:
    """The printer's queue, from the first event, decoded and printed."""
    seen: set[str] = set()
    progress = _Progress(want)
    for method, properties, body in queues.channel.consume(queues.queue, auto_ack=True, inactivity_timeout=0.5):
        if method is not None:
            event = registry.decode(body)
            seen.add(event["id"])
            raw = properties.headers or {}
            headers = {k: v.decode(errors="replace") if isinstance(v, bytes) else str(v) for k, v in raw.items()}
            _print_event(f"{method.routing_key}#{method.delivery_tag}", event, headers)
        progress.show(len(seen))
        if stop.is_set() or (want is not None and len(seen) >= want):
            break
    queues.channel.cancel()
    return len(seen)


def _printer(
    registry: SchemaFolder,
    settings: Settings,
    topic: str,
    want: int | None,
    stop: threading.Event,
    queues: RabbitQueues | None = None,
) -> int:
    if settings.broker == "nats":
        return _nats_printer(registry, settings, topic, want, stop)
    if queues is not None:
        return _rabbitmq_printer(registry, queues, want, stop)
    consumer = Consumer(
        {
            **settings.kafka_client_config(),
            "group.id": f"outbox-demo-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: set[str] = set()
    progress = _Progress(want)
    try:
        while not stop.is_set() and (want is None or len(seen) < want):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                event = registry.decode(msg.value() or b"")
                raw = msg.headers() or []
                pairs = raw.items() if isinstance(raw, dict) else raw
                headers = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in pairs}
                seen.add(event["id"])
                _print_event(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}", event, headers)
            progress.show(len(seen))
    finally:
        consumer.close()
    return len(seen)


def run_demo(settings: Settings, events: int | None, rate: float) -> int:
    from relay.core.loop import Relay
    from relay.group.runner import Group
    from relay.wiring import build

    stack, settings = _stack_unless_configured(settings)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    relay: Relay[Any] | Group | None = None
    shipping: ShippingService | None = None
    queues: RabbitQueues | None = None
    try:
        topic = settings.topic_template.format(aggregateType="order", eventType="")
        queues = _prepare_broker(settings, topic)
        with MongoClient[dict[str, Any]](settings.mongodb_uri) as client:
            db: Database[Any] = client[settings.database]
            Outbox(db[settings.outbox_collection]).init()
            service = DemoService(db, settings.outbox_collection, settings.parts().encoding.fields)
            shipping = ShippingService(db, settings, topic)
            relay = build(settings.replace(http_port=0))
            threads = [
                threading.Thread(target=relay.run, name="relay", daemon=True),
                threading.Thread(target=service.run, args=(stop, rate, events), name="service", daemon=True),
                threading.Thread(target=shipping.run, name="shipping", daemon=True),
            ]
            for t in threads:
                t.start()
            got = _printer(SchemaFolder.bundled(), settings, topic, events, stop, queues)
            if events is not None and got >= events:
                relay = _replay(settings, relay, shipping, service.written, stop, threads)
            _report(service, shipping, got)
    except KeyboardInterrupt:
        print("\ndemo: interrupted, stopping", file=sys.stderr)
    finally:
        _wind_down(stop, [queues, shipping.inbox if shipping else None, relay], threads, stack)
    return 0


def _stack_unless_configured(settings: Settings) -> tuple[Any, Settings]:
    """A local stack and its settings, unless RELAY_MONGODB_URI or the broker's servers are set."""
    broker_set = os.environ.get(_BROKER_SETTING.get(settings.broker, "RELAY_KAFKA_BOOTSTRAP_SERVERS"))
    if os.environ.get("RELAY_MONGODB_URI") or broker_set:
        return None, settings
    return _local_stack(settings)


def _prepare_broker(settings: Settings, topic: str) -> RabbitQueues | None:
    """The servers answer; the orders' topic is made (Kafka), or the demo's queues are declared
    (RabbitMQ: before the relay starts, or its first events would have no queue)."""
    _check_servers(settings)
    if settings.broker == "kafka":
        AdminClient(dict(settings.kafka_client_config())).create_topics([NewTopic(topic, 3, 1)])  # exists: ignored
    return RabbitQueues(settings, topic) if settings.broker == "rabbitmq" else None


# The variable naming each broker's servers: set, the demo uses them instead of a local stack.
_BROKER_SETTING = {"nats": "RELAY_NATS_SERVERS", "rabbitmq": "RELAY_RABBITMQ_URL"}


def _check_servers(settings: Settings) -> None:
    """ServerUnreachableError (naming the setting, its password masked) when the MongoDB or the
    broker the settings name does not answer within RELAY_CONNECT_TIMEOUT_S (the stream is checked,
    or created, as the relay does)."""
    from relay.mongo.connection import check_mongodb, mongo_client
    from relay.wiring import broker_for

    mongo = settings.parts().mongo
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)
    broker = broker_for(settings.parts())
    try:
        broker.check_servers()
    finally:
        broker.close()


def _local_stack(settings: Settings) -> tuple[Any, Settings]:
    """A local MongoDB replica set and the broker in a temporary folder, and the settings for them."""
    from relay.dev.stack import LocalStack

    stack = LocalStack.in_temp_dir(broker=settings.broker)
    name = {"nats": "nats-server (JetStream)", "rabbitmq": "rabbitmq-server"}.get(settings.broker, "Kafka broker")
    print(f"starting a local MongoDB replica set and {name} in {stack.base_dir} ...", file=sys.stderr, flush=True)
    stack.start()
    if settings.broker == "nats":
        print(f"MongoDB {stack.mongo.uri}\nNATS    {stack.nats.url}", file=sys.stderr)
        return stack, settings.replace(mongodb_uri=stack.mongo.uri, nats_servers=stack.nats.url)
    if settings.broker == "rabbitmq":
        print(f"MongoDB  {stack.mongo.uri}\nRabbitMQ {stack.rabbitmq.address}", file=sys.stderr)
        return stack, settings.replace(mongodb_uri=stack.mongo.uri, rabbitmq_url=stack.rabbitmq.address)
    print(f"MongoDB {stack.mongo.uri}\nKafka   {stack.kafka.bootstrap_servers}", file=sys.stderr)
    return stack, settings.replace(mongodb_uri=stack.mongo.uri, kafka_bootstrap_servers=stack.kafka.bootstrap_servers)


def _report(service: DemoService, shipping: ShippingService, delivered: int) -> None:
    print(shipping.summary(), flush=True)
    print(
        f"\ndemo: {service.written} events written in transactions, {delivered} delivered and decoded", file=sys.stderr
    )
    print(json.dumps({"written": service.written, "delivered": delivered}))


def _wind_down(stop: threading.Event, stoppable: list[Any], threads: list[threading.Thread], stack: Any) -> None:
    """Stop the writer, the inbox and the relay; wait for their threads; then stop the local stack
    by pid and remove it."""
    stop.set()
    for part in stoppable:
        if part is not None:
            part.stop()
    for t in threads:
        t.join(timeout=30)
    if stack is not None:
        stack.stop()
        shutil.rmtree(stack.base_dir, ignore_errors=True)

"""Baseline: the bare relay to RabbitMQ, the least work that still does the relay's job there.

The change stream read as bench.scenarios.bare_relay reads it for Kafka: one server batch at a
time, `aggregate` with `$changeStream` (then `getMore`), decoded as RawBSONDocument, the relay's
batch size and await time. Each insert's `fullDocument` bytes are published unchanged to the
exchange with the routing key, persistent, `message_id` = the event id (the document's `_id`, what
consumers deduplicate by) and `mandatory` (a message no queue takes comes back: as the relay's,
nothing is dropped in silence), on one channel in confirm mode (pika on its asyncio adapter, as the
relay's publisher); every confirm of the batch is awaited before the next `getMore`, like the
relay's one-batch-at-a-time default. One asyncio event loop on one thread, the getMore blocking it
(nothing else is in flight then). No envelope, no header, no checkpoint, no lease. The gap between
it and the relay to RabbitMQ is what the relay's own code costs on RabbitMQ.

It runs as a process of its own (`python -m bench.scenarios.bare_rabbitmq <json>`), into an
exchange and quorum queue of its own made before it starts, timed like every RabbitMQ contestant by
the queue's depth (bench.rabbitmq.QueueOutput); its CPU and RSS are that process's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pika import BasicProperties, DeliveryMode, spec
from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, Row, wait_for
from bench.rabbitmq import QueueOutput, amqp_name
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from bench.scenarios.drain import BenchChild, CpuAtFirst, rate_of
from bench.stack import rabbitmq_url
from relay.config import Settings
from relay.dev.stack import LocalStack

RAW = CodecOptions(document_class=RawBSONDocument)
LABEL = "baseline: bare relay to RabbitMQ"
CONFIRM_TIMEOUT_S = 30.0


def bare_rabbitmq_relay(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, settings: Settings,
                        run_id: str) -> Row:
    """Drain the backlog in a child process as described above; its row (`client` unused: the
    child opens its own)."""
    name = amqp_name("bench", run_id, f"bare-rabbitmq-{backlog.variant.key}")
    output = QueueOutput(rabbitmq_url(stack), name, name)
    output.prepare()
    batch_size = settings.batch_max_events
    arguments = {"uri": stack.mongo.uri, "database": backlog.database, "collection": backlog.collection,
                 "before": [backlog.before.time, backlog.before.inc], "events": backlog.events, "url": output.url,
                 "exchange": output.exchange, "routing_key": f"bench.{run_id}.{AGGREGATE_TYPE}",
                 "batch_size": batch_size, "max_await_ms": settings.max_await_ms}
    child = BenchChild("bench.scenarios.bare_rabbitmq", arguments)
    pid = lambda: child.proc.pid if child.proc else None  # noqa: E731
    try:
        with output.opened():
            at_first = CpuAtFirst(pid, output.delivered)

            def ended() -> bool:
                at_first.poll()
                return child.returncode is not None

            try:
                with Sampler(stack_roles(stack, lambda: {"child": pid()})) as sampler:
                    launched = time.time()
                    child.start()
                    wait_for(LABEL, ended, max(120.0, backlog.events / 300), child.check_alive)
                    usage = sampler.stop()
                count = int(child.reported()["count"])
            finally:
                child.stop()
            stored = output.count()
            span = output.span(launched)
    finally:
        output.discard()
    note = (f"raw fullDocument bytes, message_id only, persistent, mandatory, confirms awaited per batch of "
            f"{batch_size}; first to last message by the queue's depth, start-up {span.start_up_s:.1f} s apart")
    if stored != count:
        note += f"; {stored} messages in queue"
    return Row(LABEL, count, span.drain_s, rate_of(count, span), variant=backlog.variant.key,
               cpu_us_per_event=at_first.per_event_us(usage.cpu_s.get("child", float("nan")), count),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", count),
               peak_rss_mb=usage.peak_rss_mb.get("child", float("nan")), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores, note=note,
               extra={"start_up_s": span.start_up_s, "start_up_cpu_s": at_first.cpu_s, "queue": output.queue,
                      "process": "child", "rabbitmq_cpu_us_per_event": usage.cpu_us_per_event("rabbitmq", count),
                      "broker": "rabbitmq", "in_queue_final": stored})


class _Confirms:
    """The channel's confirms: how many of the tags published so far are acknowledged; the first
    nack, return or close fails the run."""

    def __init__(self) -> None:
        self.published = 0
        self.acked: set[int] = set()
        self.upto = 0  # every tag up to it acknowledged
        self.failure: BaseException | None = None
        self.changed = asyncio.Event()

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, spec.Basic.Nack):
            self.failure = RuntimeError(f"basic.nack of delivery tag {method.delivery_tag}")
        elif method.multiple:
            self.upto = max(self.upto, method.delivery_tag)
        else:
            self.acked.add(method.delivery_tag)
        while self.upto + 1 in self.acked:
            self.upto += 1
            self.acked.discard(self.upto)
        self.changed.set()

    def on_return(self, _ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
        self.failure = RuntimeError(f"returned unroutable: {method.reply_text} ({method.routing_key})")
        self.changed.set()

    def on_closed(self, reason: BaseException) -> None:
        self.failure = self.failure or reason
        self.changed.set()

    async def all_in(self) -> None:
        """Until every tag published so far is acknowledged; the failure, if one came."""
        while self.failure is None and self.upto < self.published:
            self.changed.clear()
            await self.changed.wait()
        if self.failure is not None:
            raise self.failure


async def drain(a: dict[str, Any]) -> int:
    """The bare relay's loop (above) on the arguments `bare_rabbitmq_relay` passes; the events published."""
    from relay.core.redact import Uri
    from relay.rabbitmq.client import channel, close, connect, rpc
    from relay.rabbitmq.config import RabbitConfig

    collection, batch_size, exchange, key = a["collection"], a["batch_size"], a["exchange"], a["routing_key"]
    pipeline = [{"$changeStream": {"startAtOperationTime": Timestamp(*a["before"])}},
                {"$match": {"operationType": "insert"}}]
    config = RabbitConfig(url=Uri(a["url"]), exchange=exchange, tls_ca="", confirm_timeout_ms=30_000,
                          connect_timeout_s=30.0, delivery="at-least-once")
    confirms = _Confirms()
    connection = await connect(config, on_closed=confirms.on_closed)
    count = 0
    client: MongoClient[Any]
    try:
        ch = await channel(connection, on_closed=lambda _ch, reason: confirms.on_closed(reason))
        await rpc(ch, ch.confirm_delivery, ack_nack_callback=confirms.on_confirm)
        ch.add_on_return_callback(confirms.on_return)
        with MongoClient(a["uri"]) as client, client.start_session() as session:
            db = client[a["database"]]
            reply = db.command("aggregate", collection, pipeline=pipeline, cursor={"batchSize": batch_size},
                               session=session, codec_options=RAW)
            cursor_id, batch = reply["cursor"]["id"], reply["cursor"]["firstBatch"]
            try:
                while True:
                    for change in batch:
                        document = change["fullDocument"]
                        properties = BasicProperties(message_id=str(document["_id"]),
                                                     delivery_mode=DeliveryMode.Persistent.value)
                        ch.basic_publish(exchange, key, bytes(document.raw), properties, mandatory=True)
                        confirms.published += 1
                    await asyncio.wait_for(confirms.all_in(), CONFIRM_TIMEOUT_S)
                    count += len(batch)
                    if count >= a["events"]:
                        return count
                    reply = db.command("getMore", cursor_id, collection=collection, batchSize=batch_size,
                                       maxTimeMS=a["max_await_ms"], session=session, codec_options=RAW)
                    batch = reply["cursor"]["nextBatch"]
            finally:
                db.command("killCursors", collection, cursors=[cursor_id], session=session)
    finally:
        close(connection)


if __name__ == "__main__":
    print(json.dumps({"count": asyncio.run(drain(json.loads(sys.argv[1])))}), flush=True)

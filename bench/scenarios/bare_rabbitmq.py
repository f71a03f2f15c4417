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
from contextlib import closing
from typing import Any

from pika import BasicProperties, DeliveryMode, spec
from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, Row
from bench.rabbitmq import QueueOutput, amqp_name
from bench.scenarios.backlog import Backlog
from bench.scenarios.bare import change_arguments, raw_change_batches, run_bare
from bench.stack import rabbitmq_url
from relay.config import Settings
from relay.dev.stack import LocalStack

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
    arguments = {**change_arguments(stack, backlog, batch_size, settings.max_await_ms), "url": output.url,
                 "exchange": output.exchange, "routing_key": f"bench.{run_id}.{AGGREGATE_TYPE}"}
    run = run_bare(stack, backlog, output, "bench.scenarios.bare_rabbitmq", arguments, LABEL)
    note = (f"raw fullDocument bytes, message_id only, persistent, mandatory, confirms awaited per batch of "
            f"{batch_size}; first to last message by the queue's depth, start-up {run.span.start_up_s:.1f} s apart")
    if run.stored != run.count:
        note += f"; {run.stored} messages in queue"
    return run.row(LABEL, backlog, note, {"queue": output.queue, "broker": "rabbitmq", "in_queue_final": run.stored,
                                          "rabbitmq_cpu_us_per_event": run.usage.cpu_us_per_event("rabbitmq",
                                                                                                  run.count)})


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

    exchange, key, count = a["exchange"], a["routing_key"], 0
    config = RabbitConfig(url=Uri(a["url"]), exchange=exchange, tls_ca="", confirm_timeout_ms=30_000,
                          connect_timeout_s=30.0, delivery="at-least-once")
    confirms = _Confirms()
    connection = await connect(config, on_closed=confirms.on_closed)
    try:
        ch = await channel(connection, on_closed=lambda _ch, reason: confirms.on_closed(reason))
        await rpc(ch, ch.confirm_delivery, ack_nack_callback=confirms.on_confirm)
        ch.add_on_return_callback(confirms.on_return)
        with closing(raw_change_batches(a)) as batches:
            for batch in batches:
                for change in batch:
                    document = change["fullDocument"]
                    properties = BasicProperties(message_id=str(document["_id"]),
                                                 delivery_mode=DeliveryMode.Persistent.value)
                    ch.basic_publish(exchange, key, bytes(document.raw), properties, mandatory=True)
                    confirms.published += 1
                await asyncio.wait_for(confirms.all_in(), CONFIRM_TIMEOUT_S)
                count += len(batch)
                if count >= a["events"]:
                    break
        return count
    finally:
        close(connection)


if __name__ == "__main__":
    print(json.dumps({"count": asyncio.run(drain(json.loads(sys.argv[1])))}), flush=True)

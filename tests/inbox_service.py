"""A downstream service consuming through the inbox, as a process the kill test SIGKILLs.

Usage: python -m tests.inbox_service MONGODB_URI DATABASE TOPIC GROUP BOOTSTRAP [sync|async]

BOOTSTRAP is Kafka's bootstrap servers, a nats:// server (TOPIC a subject of the stream in
INBOX_TEST_NATS_STREAM) or an amqp:// URL (TOPIC the queue, the exchange in
INBOX_TEST_RABBITMQ_EXCHANGE).

`sync` (the default) runs `Inbox`, `async` runs `AsyncInbox` in an event loop (SIGTERM and SIGINT
call its `stop()` through `loop.add_signal_handler`, as a service would). Both apply the same
effects with the same options.

With INBOX_TEST_COMMIT_DELAY_S set, every Kafka offset commit waits that long first: the window
between a batch's MongoDB commit and its offset commit, the one the inbox exists for, is then wide
enough for the kill test to aim a SIGKILL into it. The wait is on the consumer's thread (in the
async form, the Kafka thread; the event loop does not wait).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import pymongo

from relay.inbox import AsyncInbox, Inbox
from relay.inbox import sources as sources_module
from relay.inbox.consumer import KafkaSource
from relay.ops.logs import setup_logging
from tests.inbox_support import INBOX, async_effects_handler, effects_handler


class SlowCommitSource(KafkaSource):
    """The inbox's consumer, each offset commit delayed (the MongoDB transaction already committed)."""

    def commit(self, offsets: dict[tuple[str, int], int]) -> bool:
        if offsets:
            time.sleep(float(os.environ["INBOX_TEST_COMMIT_DELAY_S"]))
        return super().commit(offsets)


def run_options(topic: str, group: str, bootstrap: str) -> dict[str, Any]:
    if bootstrap.startswith("nats://"):
        # NATS JetStream (tests/nats): BOOTSTRAP is the server, the stream in INBOX_TEST_NATS_STREAM;
        # a killed consumer's batch is delivered again after ack_wait_s (short here).
        return dict(topics=[topic], group_id=group, nats_servers=bootstrap, batch_max_events=40, batch_max_ms=50,
                    nats_stream=os.environ["INBOX_TEST_NATS_STREAM"], ack_wait_s=2.0)
    if bootstrap.startswith(("amqp://", "amqps://")):
        # RabbitMQ (tests/rabbitmq): TOPIC is the queue (bound by the test), BOOTSTRAP the server's
        # URL, the exchange in INBOX_TEST_RABBITMQ_EXCHANGE; a killed consumer's unacknowledged
        # batch goes back to the queue at once, ahead of the rest.
        return dict(topics=[topic], group_id=group, rabbitmq_url=bootstrap, batch_max_events=40, batch_max_ms=50,
                    rabbitmq_exchange=os.environ["INBOX_TEST_RABBITMQ_EXCHANGE"])
    # Small batches: more MongoDB commits followed by Kafka commits for a kill to fall between.
    return dict(topics=[topic], group_id=group, bootstrap_servers=bootstrap, batch_max_events=40, batch_max_ms=50,
                # Static membership: the restarted process takes its partitions back at once
                # instead of waiting for the killed member's session to expire.
                kafka={"group.instance.id": f"{group}-service", "session.timeout.ms": "6000"})


async def run_async(uri: str, database: str, options: dict[str, Any]) -> None:
    client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(uri, tz_aware=True)
    db = client[database]
    inbox = AsyncInbox(db[INBOX])
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, inbox.stop)
    try:
        await inbox.run(async_effects_handler(db), **options)
    finally:
        await client.close()


def main(uri: str, database: str, topic: str, group: str, bootstrap: str, form: str = "sync") -> None:
    setup_logging("INFO", "json")
    if os.environ.get("INBOX_TEST_COMMIT_DELAY_S"):
        sources_module.KafkaSource = SlowCommitSource  # type: ignore[misc]  # both forms open it there
    options = run_options(topic, group, bootstrap)
    if form == "async":
        asyncio.run(run_async(uri, database, options))
        return
    db = pymongo.MongoClient(uri, tz_aware=True)[database]
    Inbox(db[INBOX]).run(effects_handler(db), **options)


if __name__ == "__main__":
    main(*sys.argv[1:7])

"""deploy/example-service against real servers: the asyncio order API (AsyncOutbox) and the asyncio
shipping worker (AsyncInbox) as child processes, the relay publishing between them. Orders posted
over HTTP, some of them rejected (nothing written for those); every accepted order is shipped
exactly once, also after the relay publishes everything again; both processes stop on SIGTERM
with exit code 0."""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from relay.commands.status import reset_checkpoint
from tests.support.paths import ROOT
from tests.support.relays import ChildProcess, RelayThread
from tests.support.topics import topic_size
from tests.support.waiting import wait_until

SERVICE = ROOT / "deploy" / "example-service"


class ServiceProcess(ChildProcess):
    """One of the example's programs, its settings in the environment (stopped by pid)."""

    def __init__(self, script: str, log_path: Path, settings: dict[str, str]) -> None:
        self.script, self.log_path, self.settings = script, log_path, settings

    def argv(self) -> list[str]:
        return [sys.executable, str(SERVICE / self.script)]

    def environ(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), **self.settings}


def _running(process: ServiceProcess) -> Any:
    """For wait_until: fails with the process's log once it ended."""
    def check() -> None:
        assert process.alive, process.log()[-3000:]
    return check


def _committed(bootstrap: str, topic: str, group: str) -> int:
    """How many messages the group committed on `topic`, all partitions together."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": "false"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(max(tp.offset, 0) for tp in consumer.committed([TopicPartition(topic, p) for p in partitions],
                                                                  timeout=10))
    finally:
        consumer.close()


def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/orders", data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_orders_posted_to_the_async_api_are_shipped_once_by_the_async_worker(env, tmp_path):
    settings = {"MONGODB_URI": env.servers.mongodb_uri, "DATABASE": env.settings.database,
                "OUTBOX_COLLECTION": env.settings.outbox_collection, "HTTP_PORT": "0",
                "KAFKA_BOOTSTRAP_SERVERS": env.servers.kafka_bootstrap, "ORDER_TOPIC": env.topic()}
    api = ServiceProcess("orders_api.py", tmp_path / "api.log", settings).start()
    worker = ServiceProcess("shipping_worker.py", tmp_path / "worker.log", settings).start()
    try:
        listening = wait_until(lambda: re.search(r"listening on [\d.]+:(\d+)", api.log()), 60, "the API listening",
                               alive=_running(api))
        port = int(listening.group(1))
        bodies = [{"orderId": f"o-{n}", "amount": 10.0 + n} for n in range(60)]
        bodies += [{"orderId": "o-3", "amount": 1.0}, {"amount": -1}, {"orderId": "o-bad", "amount": "x"}]
        with ThreadPoolExecutor(8) as pool:  # concurrent requests: one transaction each
            answers = list(pool.map(lambda b: _post(port, b), bodies))
        assert [status for status, _ in answers] == [201] * 60 + [409, 400, 400], answers[-3:]
        accepted = {answer["orderId"]: answer["eventId"] for status, answer in answers if status == 201}
        assert env.db.orders.count_documents({}) == 60 and env.outbox.count_documents({}) == 60
        assert env.db.orders.find_one({"_id": "o-3"})["amount"] == 13.0  # the rejected duplicate wrote nothing

        with RelayThread(env.settings):
            wait_until(lambda: env.db.shipments.count_documents({}) == 60, 90, "every order shipped",
                       alive=_running(worker))
        reset_checkpoint(env.settings, force=True)  # the relay publishes every event once more
        with RelayThread(env.settings):
            wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 120, 90, "the replay")
        wait_until(lambda: _committed(env.servers.kafka_bootstrap, env.topic(), "shipping") == 120, 90,
                   "the worker through the replay", interval=1, alive=_running(worker))
        assert api.terminate() == 0 and worker.terminate() == 0
    finally:
        api.stop()
        worker.stop()
    shipments = {doc["_id"]: doc for doc in env.db.shipments.find()}
    assert {k: (v["events"], v["amount"]) for k, v in shipments.items()} == {
        order_id: ([event_id], 10.0 + int(order_id[2:])) for order_id, event_id in accepted.items()}
    assert "orders-api: stopped" in api.log() and "60 events applied, 60 duplicates skipped" in worker.log()


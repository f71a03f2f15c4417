"""The compose stack up for real (tests.containers.compose): MongoDB replica set, Kafka, the relay
and the demo writer; the demo's events reach the topic through the relay container, and
`docker compose exec relay outbox-relay tail ...` (README, "Containers") shows them."""

from __future__ import annotations

import json
from typing import Any

import pymongo
import pytest

from tests.containers import servers
from tests.containers.compose import COMPOSE_RELAY_IMAGE, ComposeStack
from tests.support.waiting import wait_until

# `make containers` builds the images; run alone after an edit, the first test to need one
# builds it (cold: several minutes on a busy machine).
pytestmark = [pytest.mark.usefixtures("docker_api"), pytest.mark.timeout(1800)]


@pytest.fixture
def stack(engine, relay_image):
    engine.run("tag", relay_image, COMPOSE_RELAY_IMAGE)
    compose = ComposeStack(engine, servers.ensure_servers(engine))
    try:
        compose.up_in_order()
        yield compose
    finally:
        compose.down()


def _tail(stack: ComposeStack, count: int) -> list[dict[str, Any]]:
    done = stack.run("exec", "-T", "relay", "outbox-relay", "tail", "outbox.event.order", "--from-beginning",
                     "--max-messages", str(count), timeout=120)
    if "no topic" in done.stderr:
        return []  # not created yet: the relay has not published its first event
    assert done.returncode == 0, f"tail failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_demo_writers_events_reach_the_topic_through_the_relay_container(stack):
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(stack.mongodb_uri)
    try:
        outbox = client["app"]["outbox"]
        wait_until(lambda: outbox.count_documents({}) >= 20, 240, "the demo writer's first 20 events")
        # The relay publishes them a moment later (and creates the topic then): ask until it has.
        found: list[list[dict[str, Any]]] = []
        wait_until(lambda: found.append(_tail(stack, 20)) or len(found[-1]) == 20, 180, "20 events on the topic")
        messages = found[-1]
        ids = {str(doc["_id"]) for doc in outbox.find({}, {"_id": 1})}
        assert {m["value"]["id"] for m in messages} <= ids, "the topic holds the demo's outbox events"
        assert all("relay_fencing_token" in m["headers"] for m in messages), "published by the relay"
    finally:
        client.close()

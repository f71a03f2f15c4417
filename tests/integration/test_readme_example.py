"""The README's "Using it from a service" example, run as written against the test servers."""

from __future__ import annotations

import re

from tests.support.paths import ROOT
from tests.support.relays import RelayThread
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until


def _readme_example() -> str:
    section = (ROOT / "README.md").read_text().split("## Using it from a service", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README's service example is a ```python block"
    return match[1]


def test_the_readme_service_example_is_published_by_the_relay(env):
    code = _readme_example()
    # Only where it points: this test's servers and database instead of localhost and `app`.
    assert 'MongoClient("mongodb://localhost:27017/?replicaSet=rs0")' in code and "client.app" in code
    code = (code.replace('"mongodb://localhost:27017/?replicaSet=rs0"', repr(env.servers.mongodb_uri))
                .replace("client.app", f"client[{env.settings.database!r}]"))
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)
    scope["client"].close()  # type: ignore[attr-defined]
    order = env.db.orders.find_one()
    [doc] = list(env.outbox.find())
    with RelayThread(env.settings) as relay:
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic(doc["aggregateType"]))
                   or not relay.thread.is_alive(), 60, "the example's event in Kafka")
    assert relay.error is None, relay.error
    [record] = read_topic(env.servers.kafka_bootstrap, env.topic(doc["aggregateType"]))
    assert record.id == str(doc["_id"]) and record.key == doc["aggregateId"] == order["_id"]
    assert (record.event["eventType"], record.event["payload"]) == (doc["eventType"], doc["payload"])

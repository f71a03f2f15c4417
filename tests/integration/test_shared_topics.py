"""Topics shared by accident (issue 42, relay.avro.shared_topics): two outboxes of RELAY_OUTBOXES
in different databases, with a topic template that names no database, route an aggregate type
they share to one topic. `run` says so in one WARNING at start, naming both outboxes and the
`{database}` placeholder; `status` lists them; with `{database}` in the template neither does."""

from __future__ import annotations

import json

from relay.commands.status import status
from tests.support.relays import RelayProcess
from tests.support.waiting import wait_until


def _two_databases(env):
    first, second = f"{env.settings.database}.outbox", f"{env.settings.database}_b.outbox"
    env.client[f"{env.settings.database}_b"].create_collection("outbox")
    return first, second


def test_two_databases_on_one_topic_are_warned_about_once_at_start_and_shown_by_status(env, tmp_path):
    first, second = _two_databases(env)
    try:
        settings = env.settings.replace(outboxes=f"{first},{second}")
        proc = RelayProcess(settings, tmp_path, "shared").start()
        try:
            wait_until(lambda: "relay watching" in proc.log(), 60, f"the relay to start:\n{proc.log()[-3000:]}")
        finally:
            assert proc.terminate() == 0, proc.log()[-3000:]
        lines = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
        warned = [line for line in lines if "publish an aggregate type they share to one topic" in line["message"]]
        assert len(warned) == 1, warned
        (line,) = warned
        assert line["level"] == "WARNING" and first in line["message"] and second in line["message"]
        assert "{database}" in line["message"] and line["missing"] == "{database}"

        shown = status(settings)
        assert shown["sharedTopics"] == [
            {"outboxes": [first, second], "topicTemplate": settings.topic_template, "missingPlaceholder": "{database}"}
        ]
        apart = status(settings.replace(topic_template="t.{database}.{aggregateType}"))
        assert apart["sharedTopics"] == []
    finally:
        env.client.drop_database(f"{env.settings.database}_b")

"""The relay the benchmarks measure: its settings (defaults except addresses, database, topic,
start point and `http_port=0`), and, for the tools that watch it from inside (bench.profile,
bench.tail), the relay built in a thread of this process (`harness.relays.RelayThread`,
through `relay.wiring.build` as `outbox-relay run` does). Every measured catch-up and latency step
runs `outbox-relay run` processes instead (bench.scenarios.catch_up, bench.relay_process).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pymongo.collection import Collection

from harness.relays import RelayThread
from relay.config import Settings
from relay.dev.stack import LocalStack
from relay.wiring import build


def make_relay(settings: Settings, native: bool = True) -> Any:
    """A relay for `settings`, not started: something with `run()` (blocks until stopped) and
    `stop()`. `native=False`: every message built by the Python path (relay.avro.encoding)."""
    return build(settings, native=native)


def relay_settings(stack: LocalStack, database: str, topic_template: str, start_at: str,
                   env: dict[str, str] | None = None) -> Settings:
    """The relay's settings: defaults, plus the stack's addresses and this scenario's names
    (`env`: RELAY_* variables on top, e.g. producer properties or the pipeline depth)."""
    return Settings.load(env=env or {}, flags={
        "mongodb_uri": stack.mongo.uri,
        "kafka_bootstrap_servers": stack.kafka.bootstrap_servers,
        "database": database,
        "topic_template": topic_template,
        "start_at": start_at,
        "http_port": 0,
        "instance_id": f"bench-{os.getpid()}-{database}",
    })


@contextmanager
def running_relay(settings: Settings, native: bool = True) -> Iterator[RelayThread]:
    """A relay thread, not yet started (call `start()`), stopped on exit."""
    runner = RelayThread(settings, relay=make_relay(settings, native))
    try:
        yield runner
    finally:
        if not runner.stop():
            raise RuntimeError("the relay thread did not stop within 60 s")


def lease_token_data(leases: Collection[Any], lease_id: str) -> tuple[str | None, dt.datetime | None]:
    """The stored checkpoint (`resumeToken._data`) and its `checkpointAt`, if any."""
    doc = leases.find_one({"_id": lease_id}, {"resumeToken": 1, "checkpointAt": 1})
    token = (doc or {}).get("resumeToken") or {}
    data = token.get("_data")
    return (data if isinstance(data, str) else None), (doc or {}).get("checkpointAt")

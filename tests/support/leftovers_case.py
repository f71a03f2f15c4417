"""Not part of the suite (its name is not test_*): tests/integration/test_leftovers.py runs it in a
pytest of its own, with a worker, and kills that pytest's controller while this test waits."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.support.relays import RelayProcess
from tests.support.servers import needs_local_stack


def test_servers_and_a_relay_then_wait(env, tmp_path):
    stack = needs_local_stack(env.servers)
    relay = RelayProcess(env.settings, tmp_path, "relay").start()
    assert relay.proc is not None
    pids = {"worker": os.getpid(), "relay": relay.proc.pid, "kafka": stack.kafka.process.pid,
            **{f"mongod{i}": p.pid for i, p in enumerate(stack.mongo.processes)}}
    Path(os.environ["RELAY_TEST_LEFTOVERS"]).write_text(json.dumps(pids))
    time.sleep(300)  # killed before this ends

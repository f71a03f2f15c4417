"""The benchmark's servers: one fresh local stack (a mongod replica-set member and a Kafka broker
in a temporary folder, topics of PARTITIONS partitions), the broker warmed up, a client on mongod;
stopped by pid and deleted on exit. `bench.run` and every scenario that runs alone start it here."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pymongo import MongoClient

from bench.common import PARTITIONS, log, progress, warm_up_kafka
from relay.dev.stack import LocalStack


@contextmanager
def bench_stack() -> Iterator[tuple[LocalStack, MongoClient[Any]]]:
    """The started stack and a tz-aware client on its mongod; everything stopped and deleted on exit."""
    stack = LocalStack.in_temp_dir(partitions=PARTITIONS)
    progress(f"starting MongoDB and Kafka in {stack.base_dir}")
    try:
        stack.start()
        warm_up_kafka(stack.kafka.bootstrap_servers)
        client: MongoClient[Any]
        with MongoClient(stack.mongo.uri, tz_aware=True) as client:
            yield stack, client
    finally:
        progress("stopping the stack")
        stack.stop()
        leftovers = [p.pid for p in [*stack.mongo.processes, stack.kafka.process] if p is not None and p.alive]
        if leftovers:
            log.error("stack processes still running after stop(): %s", leftovers)
        shutil.rmtree(stack.base_dir, ignore_errors=True)

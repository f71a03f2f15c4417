"""The benchmark's servers: one fresh local stack (a mongod replica-set member and a Kafka broker
in a temporary folder, topics of PARTITIONS partitions), the broker warmed up, a client on mongod;
with `nats=True` also a nats-server with JetStream (relay.dev.nats_server, from the pinned wheel,
on a loopback port reserved for it, its store in the same folder), with `rabbitmq=True` a
rabbitmq-server (relay.dev.rabbitmq_server: Debian's packages, its ports reserved, its database in
the same folder). Everything is stopped by pid and deleted on exit. `bench.run` and every scenario that runs alone start it here, once.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from bench.common import PARTITIONS, log, progress, warm_up_kafka
from relay.dev.nats_server import NatsServer
from relay.dev.rabbitmq_server import RabbitServer
from relay.dev.stack import LocalStack


@dataclass
class BenchStack(LocalStack):
    """The local stack, and the benchmark's nats-server and rabbitmq-server when it runs them."""

    nats_server: NatsServer | None = None
    rabbitmq_server: RabbitServer | None = None


def nats_server_of(stack: Any) -> NatsServer | None:
    """The stack's nats-server, if it runs one (any LocalStack: None)."""
    return getattr(stack, "nats_server", None)


def nats_url(stack: Any) -> str:
    """The URL of the stack's nats-server; RuntimeError when it runs none."""
    server = nats_server_of(stack)
    if server is None:
        raise RuntimeError("the benchmark stack runs no nats-server: start it with bench_stack(nats=True)")
    return server.url


def rabbitmq_url(stack: Any) -> str:
    """The URL (with its guest user) of the stack's rabbitmq-server; RuntimeError when it runs none."""
    server = getattr(stack, "rabbitmq_server", None)
    if server is None:
        raise RuntimeError("the benchmark stack runs no rabbitmq-server: start it with bench_stack(rabbitmq=True)")
    return str(server.url)


@contextmanager
def bench_stack(nats: bool = False, rabbitmq: bool = False) -> Iterator[tuple[BenchStack, MongoClient[Any]]]:
    """The started stack (with a nats-server when `nats`, a rabbitmq-server when `rabbitmq`) and a
    tz-aware client on its mongod; everything stopped and deleted on exit."""
    stack = BenchStack.in_temp_dir(partitions=PARTITIONS)
    assert isinstance(stack, BenchStack)
    more = "".join([" and nats-server" if nats else "", " and rabbitmq-server" if rabbitmq else ""])
    progress(f"starting MongoDB and Kafka{more} in {stack.base_dir}")
    try:
        if nats:
            stack.nats_server = NatsServer(stack.base_dir / "nats")
            stack.nats_server.start()
        if rabbitmq:
            stack.rabbitmq_server = RabbitServer(stack.base_dir / "rabbitmq")
            stack.rabbitmq_server.start()
        stack.start()
        warm_up_kafka(stack.kafka.bootstrap_servers)
        client: MongoClient[Any]
        with MongoClient(stack.mongo.uri, tz_aware=True) as client:
            yield stack, client
    finally:
        progress("stopping the stack")
        stack.stop()
        processes = [*stack.mongo.processes, stack.kafka.process]
        if stack.nats_server is not None:
            stack.nats_server.stop()
            processes.append(stack.nats_server.process)
        if stack.rabbitmq_server is not None:
            stack.rabbitmq_server.stop()
            processes += [stack.rabbitmq_server.process, stack.rabbitmq_server.epmd]
        leftovers = [p.pid for p in processes if p is not None and p.alive]
        if leftovers:
            log.error("stack processes still running after stop(): %s", leftovers)
        shutil.rmtree(stack.base_dir, ignore_errors=True)

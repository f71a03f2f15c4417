"""RELAY_TEST_DOCKER=1: the session's MongoDB and Kafka as containers started by testcontainers.

The same servers as the local stack (relay.dev.stack): a one-member replica set with the test
commands on, and a KRaft broker with the tested broker properties. Both on the host network at
free loopback ports, so the addresses the servers advertise are the ones the tests dial, on
Docker and on podman alike. Images: RELAY_TEST_MONGO_IMAGE (default mongo:7.0) and
RELAY_TEST_KAFKA_IMAGE (default apache/kafka:4.1.1, configured by its KAFKA_* variables).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pymongo
from testcontainers.core.container import DockerContainer

from relay.dev import stack as devstack
from relay.dev.processes import free_port
from tests.support.servers import Servers
from tests.support.topics import release_kafka_clients
from tests.support.waiting import wait_until

MONGO_IMAGE = "mongo:7.0"
KAFKA_IMAGE = f"apache/kafka:{devstack.KAFKA_VERSION}"


def _mongo(port: int) -> DockerContainer:
    image = os.environ.get("RELAY_TEST_MONGO_IMAGE", MONGO_IMAGE)
    command = f"mongod --replSet rs0 --bind_ip 127.0.0.1 --port {port} --setParameter enableTestCommands=1"
    return DockerContainer(image).with_kwargs(network_mode="host").with_command(command)


def _kafka(port: int, controller_port: int) -> DockerContainer:
    container = DockerContainer(os.environ.get("RELAY_TEST_KAFKA_IMAGE", KAFKA_IMAGE)).with_kwargs(network_mode="host")
    props = devstack._BROKER_PROPERTIES.format(port=port, controller_port=controller_port,
                                               log_dir="/tmp/kraft-combined-logs", partitions=3)
    for line in props.splitlines():
        key, value = line.split("=", 1)
        container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
    return container.with_env("CLUSTER_ID", devstack._cluster_id())


def _initiate(port: int) -> str:
    direct: pymongo.MongoClient[Any] = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                                           serverSelectionTimeoutMS=2000)
    try:
        wait_until(lambda: _pings(direct), 120, "mongod in its container to answer")
        member = {"_id": 0, "host": f"127.0.0.1:{port}"}
        direct.admin.command("replSetInitiate", {"_id": "rs0", "members": [member]})
        wait_until(lambda: direct.admin.command("hello").get("isWritablePrimary"), 60, "a primary")
    finally:
        direct.close()
    return f"mongodb://127.0.0.1:{port}/?replicaSet=rs0"


def _pings(client: pymongo.MongoClient[Any]) -> bool:
    try:
        return bool(client.admin.command("ping").get("ok"))
    except pymongo.errors.PyMongoError:
        return False


def _serves(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            return bool(admin.list_topics(timeout=2).brokers)
    except Exception:  # noqa: BLE001 - not up yet
        return False


def docker_servers() -> Iterator[Servers]:
    """Start both containers, wait until they serve, yield their addresses, remove them."""
    mongo_port, kafka_port, controller_port = free_port(), free_port(), free_port()
    with _mongo(mongo_port) as _, _kafka(kafka_port, controller_port) as _:
        uri = _initiate(mongo_port)
        bootstrap = f"127.0.0.1:{kafka_port}"
        wait_until(lambda: _serves(bootstrap), 120, "the Kafka broker in its container to serve metadata")
        try:
            yield Servers(uri, bootstrap, None)
        finally:
            release_kafka_clients()

"""The benchmark's peers: Kafka Connect source connectors for the same outbox, run for comparison.

`bench.run` drains the same backlog with each peer, one at a time, after the relay:
- Debezium's MongoDB connector with its outbox event router SMT (`MongoEventRouter`);
- the official MongoDB Kafka source connector (`MongoSourceConnector`).
Each runs in its own Kafka Connect standalone worker JVM (`ConnectStandalone`), from Maven
Central jars resolved once into the cache (`python -m bench.peers fetch`).
See `bench.peers.connect` for what is configured and how each worker is started and stopped.
"""

from __future__ import annotations

from bench.peers.connect import (
    DEBEZIUM_VERSION,
    KAFKA_CONNECT_VERSION,
    MONGO_KAFKA_VERSION,
    ConnectorSpec,
    PeerJars,
    StandaloneWorker,
    debezium_outbox_connector,
    fetch_jars,
    mongodb_source_connector,
)

__all__ = [
    "DEBEZIUM_VERSION", "KAFKA_CONNECT_VERSION", "MONGO_KAFKA_VERSION", "ConnectorSpec", "PeerJars",
    "StandaloneWorker", "debezium_outbox_connector", "fetch_jars", "mongodb_source_connector",
]

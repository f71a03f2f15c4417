"""Reading Kafka topics in tests: `relay.dev.harness.topics`, shared with the benchmarks
(re-exported here)."""

from relay.dev.harness.topics import (
    REGISTRY,
    Record,
    close_admin_clients,
    read_messages,
    read_topic,
    release_kafka_clients,
    topic_size,
    uncommitted_messages,
    watermark_sum,
)

__all__ = ["REGISTRY", "Record", "close_admin_clients", "read_messages", "read_topic", "release_kafka_clients",
           "topic_size", "uncommitted_messages", "watermark_sum"]

"""Reading Kafka topics in tests: `harness.topics`, shared with the benchmarks
(re-exported here)."""

from harness.topics import (
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

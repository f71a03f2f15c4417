"""The Spark jobs' Kafka source reads committed transactions only (relay.spark.decode.kafka_options):
an exactly-once relay killed or fenced mid-transaction leaves aborted messages in the log, which
the jobs must not see (docs/exactly-once.md)."""

from __future__ import annotations

from confluent_kafka import Producer

from relay.spark.decode import kafka_options


def _transactions(bootstrap: str, topic: str) -> None:
    """Three committed messages, two aborted, one committed: the log also holds three markers."""
    with Producer({"bootstrap.servers": bootstrap, "transactional.id": f"spark-isolation-{topic}"}) as producer:
        producer.init_transactions(30)
        for commit, n in ((True, 3), (False, 2), (True, 1)):
            producer.begin_transaction()
            for i in range(n):
                producer.produce(topic, f"{commit}-{i}".encode(), partition=0)
            producer.flush(30)
            (producer.commit_transaction if commit else producer.abort_transaction)(30)


def test_the_kafka_source_skips_aborted_transactions_unless_told_otherwise(spark, env):
    topic = env.topic()
    _transactions(env.servers.kafka_bootstrap, topic)

    def values(client=None):
        options = kafka_options(env.servers.kafka_bootstrap, [topic], None, client)
        frame = (spark.read.format("kafka").options(**options).option("startingOffsets", "earliest")
                 .option("endingOffsets", "latest").load())
        return sorted(bytes(row.value).decode() for row in frame.select("value").collect())

    assert values() == ["True-0", "True-0", "True-1", "True-2"]
    assert values({"isolation.level": "read_uncommitted"}) == [
        "False-0", "False-1", "True-0", "True-0", "True-1", "True-2"]

"""The loop and what it is made of, free of drivers and codecs.

`loop` (the one place that knows the order of steps), `window` (deliveries in flight), `poison`
(the poison policy), `boundaries` (the protocols the loop is given), `errors` (the error tree,
each kind with its action), `positions` (tokens, batches, checkpoints, grants), `resume` (where
a session resumes), `partitions` (which events a partition holds), `message` (the Kafka record
and its fixed names), `config` (the loop's settings). Nothing here imports pymongo, bson,
confluent_kafka, fastavro, avro or pyspark (tests/unit/test_architecture.py checks it).
"""

"""The loop and what it is made of, free of drivers and codecs.

`loop` (the one place that knows the order of steps), `window` (parcels in flight), `poison`
(the poison policy), `boundaries` (the protocols the loop is given), `errors` (the error tree,
each kind with its action), `positions` (tokens, cluster times, start points, checkpoints,
grants), `change` (the `Change` values and `Batch` the source hands the loop), `resume` (where a
session resumes), `partitions` (which events a partition holds), `message` (the Kafka record
and its fixed names), `redact` (how credentials are shown), `config` (the loop's settings).
Nothing here imports pymongo, bson, confluent_kafka, fastavro, avro or pyspark (import-linter's
contract in pyproject.toml, run by `make lint` and tests/unit/test_architecture.py, checks it).
"""

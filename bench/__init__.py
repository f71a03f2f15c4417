"""Benchmarks for the outbox relay on a real local stack (`make bench`, `python -m bench.run`).

`bench.run` starts a MongoDB replica set and a Kafka broker with `relay.devstack.LocalStack`,
measures catch-up throughput against two bare-client baselines, steady-state latency at a
fixed rate, and the process's memory, then prints a table and writes
`bench/results/latest.json`.
"""

"""Benchmarks for the outbox relay on a real local stack (`make bench`, `python -m bench.run`).

`bench.run` starts a MongoDB replica set and a Kafka broker with `relay.dev.stack.LocalStack` and
runs the scenarios of `bench.scenarios` on it: the relay's catch-up beside a bare relay, a bare
change stream, a bare producer and three peers, with payload variants; steady-state latency at
fixed rates; memory through a long backlog. `bench.report` prints the tables and writes
`bench/results/latest.json` (and, on request, BENCHMARKS.md). See BENCHMARKS.md.
"""

"""The benchmark's scenarios, one module each; `bench.run` runs them in order on one stack.

- `backlog`: writes N outbox events (set-up of the catch-up scenarios, not a rating);
- `catch_up`, `exactly_once`: the relay drains a backlog, timed to the checkpoint that covers it;
- `bare_relay`, `change_stream`, `producer`: baselines on the same backlog / messages;
- `peers`: Kafka Connect peers (Debezium, MongoDB connector) and Conduit on the same backlog;
- `fair`: the catch-up on equal terms (fresh backlogs, idle servers, rotated rounds);
- `latency`, `steady`: steady-state latency of one contender, and the steps in rotated rounds;
- `memory`: RSS through a long (1,000,000-event) backlog; `partitions`, `inbox`: their own runs.
"""

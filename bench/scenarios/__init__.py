"""The benchmark's scenarios, one module each; `bench.run` runs them in order on one stack.

- `backlog`: writes N outbox events (set-up of the catch-up scenarios, not a rating);
- `catch_up`: the relay drains a backlog, timed to the checkpoint that covers it;
- `exactly_once`: the same catch-up with RELAY_DELIVERY=exactly-once (Kafka transactions spanning reads);
- `bare_relay`, `change_stream`, `producer`: baselines on the same backlog / messages;
- `peers`: Kafka Connect peers (Debezium, MongoDB connector) and Conduit on the same backlog;
- `latency`: steady-state latency at a fixed insert rate;
- `memory`: RSS through a long (1,000,000-event) backlog.
"""

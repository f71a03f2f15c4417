"""Test helpers by concern: paths, waiting, logs, servers, relays, writes, topics, oracle, leases, mongodb."""

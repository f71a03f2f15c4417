"""Change events made by hand: `relay.dev.harness.changes`, shared with the benchmarks
(re-exported here)."""

from relay.dev.harness.changes import change_value, insert_change

__all__ = ["change_value", "insert_change"]

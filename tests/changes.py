"""Change events made by hand: `harness.changes`, shared with the benchmarks
(re-exported here)."""

from harness.changes import change_value, insert_change

__all__ = ["change_value", "insert_change"]

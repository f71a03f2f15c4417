"""Waiting in tests: `harness.waiting`, shared with the benchmarks (re-exported here)."""

from harness.waiting import WaitTimeout, wait_until

__all__ = ["WaitTimeout", "wait_until"]

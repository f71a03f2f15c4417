"""Waiting in tests: `relay.dev.harness.waiting`, shared with the benchmarks (re-exported here)."""

from relay.dev.harness.waiting import WaitTimeout, wait_until

__all__ = ["WaitTimeout", "wait_until"]

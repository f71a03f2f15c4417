"""Running the relay under test: `harness.relays`, shared with the benchmarks
(re-exported here)."""

from harness.relays import ChildProcess, RelayProcess, RelayThread, settings_env

__all__ = ["ChildProcess", "RelayProcess", "RelayThread", "settings_env"]

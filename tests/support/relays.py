"""Running the relay under test: `relay.dev.harness.relays`, shared with the benchmarks
(re-exported here)."""

from relay.dev.harness.relays import ChildProcess, RelayProcess, RelayThread, settings_env

__all__ = ["ChildProcess", "RelayProcess", "RelayThread", "settings_env"]

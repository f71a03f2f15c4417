"""What the tests and the benchmarks share to drive the relay from outside and read what it
published: waiting for a condition (`waiting`), reading topics (`topics`), the relay in a thread
or as a child process stopped by its pid (`relays`), and change events made by hand (`changes`).

Dev tooling, like the rest of relay.dev: nothing of the relay's own path imports it. It lives
here, not in tests/, so that `bench` imports no test module (tests/support re-exports it).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
"""The repository (the folder that holds `relay/`): the working folder and PYTHONPATH of the
relay's child processes."""

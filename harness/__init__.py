"""What the tests and the benchmarks share to drive the relay from outside and read what it
published: waiting for a condition (`waiting`), reading topics (`topics`), the relay in a thread
or as a child process stopped by its pid (`relays`), and change events made by hand (`changes`).

It belongs to the checkout, beside `tests/` and `bench/`, not to the relay: the wheel does not
ship it (pyproject.toml's packages), nothing in `relay/` imports it (import-linter), it imports
nothing of `tests/` or `bench/` (tests/static/test_imports.py), and `tests/support` re-exports it.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout (the folder that holds `relay/` and `harness/`): the working folder and PYTHONPATH
of the relay's child processes."""

"""Waiting in tests and benchmarks: `wait_until` polls a predicate until it holds, and raises
`WaitTimeout` when it does not in time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class WaitTimeout(AssertionError, TimeoutError):
    """Raised when `wait_until` gives up: a failed test to pytest, a `TimeoutError` to the benchmarks."""


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.2,
    alive: Callable[[], None] | None = None,
) -> Any:
    """Poll `predicate` every `interval` s until it returns a truthy value, which is returned.

    `alive` (optional) is called between polls and may raise to abort the wait, e.g. when the
    relay thread being waited on has died. Raises `WaitTimeout` after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)

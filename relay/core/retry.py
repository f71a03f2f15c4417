"""Retries and backoff, written one way: tenacity runs them.

- `retrying(...)`: a `tenacity.Retrying` for a call that may fail for a while (a Kafka transaction
  call the broker answers "not yet", a topic the broker does not know yet, a MongoDB transaction
  pymongo gave up on). `retry_on` decides which errors are retried; `give_up_after_s` bounds the
  time spent (the last error is then raised as it is); `wait` is tenacity's wait between attempts
  (none by default: most calls retried here block for a slice themselves); `between` runs before
  each wait, e.g. the lease heartbeat where a wait must keep the lease; `sleep` may be an
  interruptible wait.
- `Backoff`: a schedule of waits across calls, for what is not one call (the relay loop restarts a
  failed session on a later pass): `wait()` sleeps the next wait, `reset()` starts over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from tenacity import (
    AttemptManager,
    RetryCallState,
    Retrying,
    retry_always,
    retry_if_exception,
    stop_after_delay,
    stop_never,
    wait_none,
)
from tenacity.wait import wait_base


def retrying(
    retry_on: Callable[[BaseException], bool],
    *,
    give_up_after_s: float | None = None,
    wait: wait_base | None = None,
    between: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Retrying:
    """A tenacity retrier: call it with the function and its arguments (`retrying(...)(f, *args)`).
    Errors `retry_on` refuses, and the last error once `give_up_after_s` passed, are raised as they are."""

    def before_sleep(_: RetryCallState) -> None:
        if between is not None:
            between()

    return Retrying(
        retry=retry_if_exception(retry_on),
        stop=stop_never if give_up_after_s is None else stop_after_delay(give_up_after_s),
        wait=wait if wait is not None else wait_none(),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )


class Backoff:
    """Waits that grow across calls: the first `wait()` after `reset()` (or construction) returns
    at once, each later one sleeps `schedule`'s next wait. tenacity runs the schedule: each call is
    one attempt of a `Retrying` run that always asks for another, so tenacity computes each wait
    from the attempt number, reports it to `before` and sleeps it with `sleep`."""

    def __init__(self, schedule: wait_base, sleep: Callable[[float], None], before: Callable[[float], None]) -> None:
        self._schedule = schedule
        self._sleep = sleep
        self._before = before
        self._attempts: Iterator[AttemptManager] | None = None

    def reset(self) -> None:
        """Start the schedule over: the next `wait()` returns at once."""
        self._attempts = None

    def wait(self) -> None:
        """Sleep the schedule's next wait (none right after a reset), reporting it first."""
        if self._attempts is None:
            self._attempts = iter(
                Retrying(
                    retry=retry_always,
                    stop=stop_never,
                    wait=self._schedule,
                    sleep=self._sleep,
                    before_sleep=lambda state: self._before(state.upcoming_sleep),
                )
            )
            self._before(0.0)
        attempt = next(self._attempts)  # tenacity sleeps before every attempt but the first
        with attempt:
            pass  # this attempt is the session about to start; retry_always asks for the next one

"""Retries and backoff, written one way: tenacity runs them.

- `retrying(...)`: a `tenacity.Retrying` for a call that may fail for a while (a Kafka transaction
  call the broker answers "not yet", a topic the broker does not know yet, an inbox batch whose
  MongoDB transaction failed). `retry_on` decides which errors are retried; `give_up_after_s`
  bounds the time spent, `attempts` the number of calls, `until()` ends the retries when it turns true (a stop), and the last
  error is then raised as it is, or `gave_up(state)` decides; `wait` is tenacity's wait between
  attempts (none by default: most calls retried here block for a slice themselves);
  `before_wait(error, seconds)` runs before each wait, e.g. the lease heartbeat where a wait must
  keep the lease, or a log line; `sleep` may be an interruptible wait.
  `retrying_async(...)` is the same for a coroutine, its waits awaited (the async inbox).
- `Backoff`: a schedule of waits across calls, for what is not one call (the relay loop restarts a
  failed session on a later pass): `wait()` sleeps the next wait, `reset()` starts over.
- `said_while_waiting(...)`: one call that waits for a server itself (pymongo's server selection,
  librdkafka's metadata request), given a short first budget: when that runs out, one line says
  what is awaited and for how long, then the call gets the rest of the budget (start-up checks:
  never silence for the whole connect timeout); `waiting_line(...)` writes that line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    AttemptManager,
    RetryCallState,
    Retrying,
    retry_always,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_any,
    stop_never,
    wait_none,
)
from tenacity.wait import wait_base

from relay.core.names import env_name

T = TypeVar("T")
FIRST_WAIT_S = 1.0  # said_while_waiting: how long a server may take to answer before the line


def _policy(
    retry_on: Callable[[BaseException], bool],
    give_up_after_s: float | None,
    attempts: int | None,
    until: Callable[[], bool] | None,
    wait: wait_base | None,
    before_wait: Callable[[BaseException, float], None] | None,
    gave_up: Callable[[RetryCallState], Any] | None,
) -> dict[str, Any]:
    """The keyword arguments of `Retrying` and `AsyncRetrying` for `retrying`'s options."""
    stops: list[Any] = []
    if give_up_after_s is not None:
        stops.append(stop_after_delay(give_up_after_s))
    if attempts is not None:
        stops.append(stop_after_attempt(attempts))
    if until is not None:
        stops.append(lambda _state: until())

    def before_sleep(state: RetryCallState) -> None:
        if before_wait is not None and state.outcome is not None:
            error = state.outcome.exception()
            assert error is not None, "only failed attempts are retried"
            before_wait(error, state.upcoming_sleep)

    policy: dict[str, Any] = {
        "retry": retry_if_exception(retry_on),
        "stop": stop_any(*stops) if stops else stop_never,
        "wait": wait if wait is not None else wait_none(),
        "before_sleep": before_sleep,
    }
    if gave_up is not None:
        policy["retry_error_callback"] = gave_up
    else:
        policy["reraise"] = True
    return policy


def retrying(
    retry_on: Callable[[BaseException], bool],
    *,
    give_up_after_s: float | None = None,
    attempts: int | None = None,
    until: Callable[[], bool] | None = None,
    wait: wait_base | None = None,
    before_wait: Callable[[BaseException, float], None] | None = None,
    gave_up: Callable[[RetryCallState], Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Retrying:
    """A tenacity retrier: call it with the function and its arguments (`retrying(...)(f, *args)`).
    Errors `retry_on` refuses are raised as they are; so is the last error once it gives up, unless
    `gave_up` is given (its result is returned; it may raise)."""
    return Retrying(sleep=sleep, **_policy(retry_on, give_up_after_s, attempts, until, wait, before_wait, gave_up))


def retrying_async(
    retry_on: Callable[[BaseException], bool],
    *,
    give_up_after_s: float | None = None,
    until: Callable[[], bool] | None = None,
    wait: wait_base | None = None,
    before_wait: Callable[[BaseException, float], None] | None = None,
    gave_up: Callable[[RetryCallState], Any] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncRetrying:
    """`retrying` for a coroutine function: its waits are awaited with `sleep`."""
    return AsyncRetrying(sleep=sleep, **_policy(retry_on, give_up_after_s, None, until, wait, before_wait, gave_up))


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


def said_while_waiting(
    attempt: Callable[[float], T],
    total_s: float,
    retry_on: Callable[[BaseException], bool],
    waiting: Callable[[float], None],
    first_s: float = FIRST_WAIT_S,
) -> T:
    """`attempt(seconds)`, one call that waits up to `seconds` for a server, given `first_s` of
    `total_s` first. When it fails with an error `retry_on` accepts (no answer yet), `waiting(left)`
    writes the line saying what is awaited and for how long, then `attempt(left)` with the rest of
    `total_s`; its error is raised as it is. A server that answers within `first_s`, or an error
    `retry_on` refuses (a refused password), says nothing more. At most two attempts, `total_s`
    (plus the second call's own overrun) in all."""
    started = time.monotonic()
    first = min(first_s, total_s)
    try:
        return attempt(first)
    except Exception as exc:
        if first >= total_s or not retry_on(exc):
            raise
    left = max(total_s - (time.monotonic() - started), 0.001)
    waiting(left)
    return attempt(left)


def waiting_line(server: str, address: object, setting: str, timeout_s: float) -> Callable[[float], None]:
    """The `waiting` of `said_while_waiting` for a start-up check: one WARNING line naming the
    server, where it is looked for, its setting and how much longer the wait goes on
    (`waiting up to 29s more for MongoDB at ... (RELAY_MONGODB_URI, RELAY_CONNECT_TIMEOUT_S=30): no
    answer yet`)."""

    def waiting(left: float) -> None:
        logging.getLogger("relay").warning(
            "waiting up to %.0fs more for %s at %s (%s, %s=%g): no answer yet",
            left,
            server,
            address,
            env_name(setting),
            env_name("connect_timeout_s"),
            timeout_s,
        )

    return waiting

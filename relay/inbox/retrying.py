"""How both inboxes retry a batch's work after a transient failure: one tenacity policy.

What is retried is decided by `relay.inbox.errors.retryable` (a database outage past pymongo's own
retries, a Schema Registry that cannot be reached while decoding); anything else propagates at
once. A retry runs the same work again (the same events, in the same order), after an exponential
wait of 0.1 s, 0.2 s, ... up to `backoff_max_s`, for as long as it takes: nothing of the batch is
committed to Kafka meanwhile. A stop asked meanwhile ends the retries, also in the middle of a
wait: `StopRequested` (carrying the last failure) is raised and the batch is left uncommitted.

`Retry.call` waits by blocking (the sync inbox), `Retry.call_async` by awaiting (the async inbox);
the policy is the same object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from tenacity import RetryCallState, wait_exponential

from relay.core.retry import retrying, retrying_async
from relay.inbox.errors import retryable
from relay.inbox.stopping import StopRequested, StopSignal

T = TypeVar("T")
FIRST_WAIT_S = 0.1


class Retry:
    """Retries an attempt while it fails retryably (relay.core.retry, the one retry helper);
    `on_retry(failure, wait_s)` is told before each wait (the inbox logs it and counts it)."""

    def __init__(
        self, backoff_max_s: float, stop: StopSignal, on_retry: Callable[[BaseException, float], None]
    ) -> None:
        self._stop = stop
        self._on_retry = on_retry
        self._wait = wait_exponential(multiplier=FIRST_WAIT_S, min=FIRST_WAIT_S, max=backoff_max_s)
        self._last: BaseException | None = None

    def call(self, attempt: Callable[[], T]) -> T:
        """`attempt()` until it succeeds or fails for good; blocking waits."""
        result: T = retrying(sleep=self._sleep, **self._policy())(attempt)
        return result

    async def call_async(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """`await attempt()` until it succeeds or fails for good; the waits are awaited."""

        async def once() -> T:  # a coroutine function, which tenacity awaits (a lambda it would not)
            return await attempt()

        result: T = await retrying_async(sleep=self._sleep_async, **self._policy())(once)
        return result

    def _policy(self) -> dict[str, Any]:
        return {
            "retry_on": retryable,
            "wait": self._wait,
            "until": self._stop.is_set,  # asked while the attempt ran
            "gave_up": self._stopped,
            "before_wait": self._before_wait,
        }

    def _before_wait(self, failure: BaseException, wait_s: float) -> None:
        self._last = failure
        self._on_retry(failure, wait_s)

    def _stopped(self, state: RetryCallState) -> NoReturn:
        failure = state.outcome.exception() if state.outcome is not None else None
        raise StopRequested(failure) from failure

    def _sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise StopRequested(self._last) from self._last

    async def _sleep_async(self, seconds: float) -> None:
        if await self._stop.wait_async(seconds):
            raise StopRequested(self._last) from self._last

"""The restart policy: when a relay loop reopens after an error ended its session.

Rules (tested in tests/unit/test_restarts.py):
- The first restart after progress (a stored checkpoint that covers newly delivered events), and
  the first one ever, is immediate; each further restart without progress waits longer: 0.2 s
  doubling, plus up to 0.2 s of jitter, at most RELAY_RESTART_BACKOFF_MAX_S (`restart`).
- A poison event's replay (dead-letter it, or isolate the refused batch) starts at once
  (`restart(..., at_once=True)`), without moving the schedule.
- A reopenable change stream error (relay.core.errors.ReopenableStreamError) may be met once
  without progress: the same code again before any progress stops the relay (`check_reopen`
  raises RepeatedStreamError), since reopening from the same checkpoint would meet it again.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import wait_exponential_jitter

from relay.core.errors import ReopenableStreamError, RepeatedStreamError
from relay.core.retry import Backoff

FIRST_WAIT_S = 0.2
JITTER_S = 0.2


class RestartPolicy:
    """Waits before a loop reopens, and decides when a repeated stream error stops it."""

    def __init__(
        self, max_backoff_s: float, sleep: Callable[[float], None], report: Callable[[BaseException, float], None]
    ) -> None:
        """`sleep` waits (interruptibly: a stop ends it); `report(error, seconds)` is told of
        every restart before its wait."""
        self._report = report
        self._failed: BaseException | None = None
        self._backoff = Backoff(
            wait_exponential_jitter(multiplier=FIRST_WAIT_S, max=max_backoff_s, jitter=JITTER_S),
            sleep,
            lambda seconds: self._report(self._current, seconds),
        )
        self._repeat_code: int | None = None

    @property
    def _current(self) -> BaseException:
        assert self._failed is not None
        return self._failed

    def progressed(self) -> None:
        """A checkpoint covering newly delivered events was stored: the schedule starts over."""
        self._backoff.reset()
        self._repeat_code = None

    def restart(self, exc: BaseException, at_once: bool = False) -> None:
        """Wait before reopening after `exc` (the schedule's next wait, or none `at_once`)."""
        if at_once:
            self._report(exc, 0.0)
            return
        self._failed = exc
        self._backoff.wait()

    def check_reopen(self, exc: ReopenableStreamError) -> None:
        """Raise RepeatedStreamError (the relay stops) if `exc`'s code was met since the last
        progress; else remember it (the caller then restarts)."""
        if self._repeat_code == exc.code:
            raise RepeatedStreamError(
                f"{exc}; it repeated after reopening from the checkpoint, so the relay stops"
            ) from exc
        self._repeat_code = exc.code

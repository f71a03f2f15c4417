"""How an inbox is asked to stop, from anywhere, and what a stop during a retry wait raises.

`StopSignal.set()` may be called from any thread, from a signal handler (`signal.signal` for the
sync inbox, `loop.add_signal_handler` for the async one) or from the event loop itself. Both
forms read the same flag: the Kafka consumer's thread between polls (`is_set`), the sync inbox's
retry waits (`wait`), the async inbox's retry waits (`wait_async`, woken through the loop it is
attached to while `AsyncInbox.run` runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class StopRequested(Exception):
    """Raised inside a step when `stop()` was asked while its batch waited to be retried: the
    batch is left uncommitted, for the next consumer to read again. `cause` is the failure the
    batch was waiting to retry."""

    def __init__(self, cause: BaseException | None) -> None:
        super().__init__(str(cause))
        self.cause = cause


class StopSignal:
    """A stop flag that blocking code and an event loop can both wait on."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None

    def set(self) -> None:
        """Ask for the stop (thread- and signal-safe)."""
        self._flag.set()
        loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits on it
                loop.call_soon_threadsafe(wakeup.set)

    def is_set(self) -> bool:
        return self._flag.is_set()

    def clear(self) -> None:
        self._flag.clear()
        if self._wakeup is not None:
            self._wakeup.clear()

    def wait(self, timeout: float) -> bool:
        """Block until the stop is asked or `timeout` passed; whether it was asked."""
        return self._flag.wait(timeout)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake `loop`'s waiters on `set()` (from the loop's thread, while the async inbox runs)."""
        self._wakeup = asyncio.Event()
        self._loop = loop
        if self._flag.is_set():
            self._wakeup.set()

    def detach(self) -> None:
        self._loop, self._wakeup = None, None

    async def wait_async(self, timeout: float) -> bool:
        """Await the stop or `timeout`, without blocking the loop; whether it was asked."""
        wakeup = self._wakeup
        if self.is_set():
            return True
        if wakeup is None:  # not attached to a loop: only the flag, read after the wait
            await asyncio.sleep(timeout)
            return self.is_set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wakeup.wait(), timeout)
        return self.is_set()

"""An asyncio event loop on a thread of its own, for the brokers' asyncio clients (nats-py, pika on
its asyncio adapter) used from the relay's threads (its loops, the start-up checks, the commands).
It sits at the bottom of the layers beside relay.core, not in it: relay.nats and relay.rabbitmq both
use it, and relay.core holds no client's machinery; it imports nothing of the relay.

Why not anyio's BlockingPortal: the publisher hands parcels over with `call` (the loop's
`call_soon_threadsafe`: callbacks from one thread run in the order given, without waiting for a
reply), where a portal call waits for its result; the rest (`run`) is asyncio's own
`run_coroutine_threadsafe`, which a portal wraps.

Invariants: the loop runs until `close()`; `run` never waits longer than its timeout (the coroutine
is cancelled then); callbacks given to `call` run on the loop's thread in the order given.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoopThread:
    """An event loop running on a daemon thread named `name`, started at once."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        """The coroutine's result, run on the loop; TimeoutError (after cancelling it) when it takes
        longer than `timeout` seconds; its own exception otherwise."""
        what = getattr(coroutine, "__qualname__", "a call")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            if future.done():
                raise  # the coroutine's own TimeoutError (the same class as the wait's since 3.11)
            future.cancel()
            raise TimeoutError(f"{what}: no answer within {timeout:g} s") from exc

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start the coroutine on the loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on the loop's thread, after every callback given before."""
        self.loop.call_soon_threadsafe(callback, *args)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop (tasks still running are dropped with it) and wait for its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()

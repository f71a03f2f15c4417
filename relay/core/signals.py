"""SIGTERM and SIGINT as a stop request, written once for every long-running command: `run`, the
inbox, `replay`, the Spark pipeline's `materialize` and the demo.

`stopping_on_signals(stop, then=...)`: while the block runs, the first SIGTERM or SIGINT calls
`stop()` (after an INFO line `signal N: <says>` when `says` is given); what a further signal does is
`then`'s:

| `then` | a further signal | used by |
| --- | --- | --- |
| `AGAIN` | calls `stop()` again (a stop that is already under way goes on) | the inbox, `materialize` |
| `INTERRUPT` | raises KeyboardInterrupt in the main thread: the command's `finally` blocks run and it exits 130 | `replay` (its progress is saved per chunk) |
| `DEFAULT` | the signal's default action: the process ends at once, no clean-up | `run` |

The previous handlers come back when the block ends. Python lets only the main thread set signal
handlers: in any other thread nothing is installed, and `stop()` called by the caller's own code
(the inbox's `stop()`, a test) is the only way.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("relay")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Then(enum.Enum):
    """What a signal after the first one does (the module docstring's table)."""

    AGAIN = "again"
    INTERRUPT = "interrupt"
    DEFAULT = "default"


@contextlib.contextmanager
def stopping_on_signals(stop: Callable[[], object], then: Then = Then.AGAIN, says: str | None = None) -> Iterator[None]:
    """SIGTERM and SIGINT call `stop` while the block runs (the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        again = bool(received)
        received.append(signum)
        if again and then is Then.INTERRUPT:
            raise KeyboardInterrupt
        if not again and says is not None:
            log.info("signal %d: %s", signum, says)
        if not again and then is Then.DEFAULT:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
        stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""How a replay shows itself: on a terminal a progress bar (events done of the expected total,
rate, time left) redrawn on stderr; otherwise a JSON progress line on stdout every few seconds;
and the counts for the summary line (per outbox and topic, from the oplog and from the
collection, seconds)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

from relay.core.namespace import Namespace
from relay.core.redact import emit

BAR_WIDTH = 30


class Counts:
    """Events published (or, in a dry run, counted) per (outbox, topic, source)."""

    def __init__(self) -> None:
        self.by_key: Counter[tuple[str, str, str]] = Counter()
        self.skipped: Counter[str] = Counter()  # poison events per outbox, not replayed

    @property
    def done(self) -> int:
        return sum(self.by_key.values())

    def add(self, outbox: Namespace, topic: str, source: str, count: int = 1) -> None:
        self.by_key[(str(outbox), topic, source)] += count

    def skip(self, outbox: Namespace) -> None:
        """A poison event of `outbox` left out (the replay's policy, `skip`)."""
        self.skipped[str(outbox)] += 1

    def summary(self) -> dict[str, Any]:
        """{outbox: {topic: {"oplog": n, "collection": n}}}."""
        result: dict[str, Any] = {}
        for (outbox, topic, source), count in sorted(self.by_key.items()):
            sources = result.setdefault(outbox, {}).setdefault(topic, {"oplog": 0, "collection": 0})
            sources[source] += count
        return result


def bar_line(done: int, total: int, rate: float, width: int = BAR_WIDTH) -> str:
    """One progress bar: `[#####-----] done/total  rate/s  time left` (the total may be an
    estimate the count outgrows: the bar is then full and the time left unknown)."""
    shown = max(total, done)
    filled = width if shown == 0 else int(width * done / shown)
    left = (shown - done) / rate if rate > 0 and done < shown else None
    eta = "--:--" if left is None else f"{int(left) // 60:02d}:{int(left) % 60:02d}"
    return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total} {rate:.0f} events/s, {eta} left"


class Progress:
    """Reports progress at most every `interval_s` (`tick`), as a bar on a terminal, else as JSON."""

    def __init__(
        self,
        replay_id: str,
        total: int,
        counts: Counts,
        out: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._id = replay_id
        self.total = total
        self._counts = counts
        self._out = out or sys.stdout
        self._tty = sys.stderr.isatty() if tty is None else tty
        self._interval = 0.2 if self._tty else interval_s
        self._clock = clock
        self.started = clock()
        self._last = self.started

    @property
    def seconds(self) -> float:
        return self._clock() - self.started

    def rate(self) -> float:
        seconds = self.seconds
        return self._counts.done / seconds if seconds > 0 else 0.0

    def tick(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        done = self._counts.done
        if self._tty:
            sys.stderr.write("\r" + bar_line(done, self.total, self.rate()))
            sys.stderr.flush()
            return
        line = {
            "replay": self._id,
            "progress": {"done": done, "total": self.total},
            "eventsPerS": round(self.rate(), 1),
        }
        emit(json.dumps(line), self._out)

    def finish(self) -> None:
        if self._tty:
            self.tick(force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()

"""`python -m bench.profiled_relay run`: the relay as deployed, with a profiler inside it.

For `bench.profile --process`. The relay runs as `outbox-relay run` does (relay.cli.main, in a
process of its own, its settings from RELAY_* variables); besides:
- every Python thread (the main thread, which runs the loop, and each thread the relay starts,
  the change stream's read-ahead among them) runs under cProfile timed by `time.thread_time`, so
  a function's cumulative time is the CPU its thread spent in it (librdkafka's own threads are
  C: their CPU is in the process's total, in no function here); the threads still running at
  exit (pymongo's server monitors, daemons) are left out;
- bench.timeline times the loop's calls (reads, encoding, sends, the waits for acknowledgements,
  the stored checkpoints) and every getMore on the wall clock.
At exit (SIGTERM: the relay finishes the batch in flight and returns) both are written beside
BENCH_PROFILE_OUT: `<it>.pstats` (pstats) and `<it>.txt` (the timeline's lines). The profiler slows
the relay: read rates from runs without it, CPU shares from this one.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import threading
import time
from pathlib import Path

from bench.timeline import Timeline
from relay.cli import main as relay_main

OUT = "BENCH_PROFILE_OUT"


def main(argv: list[str]) -> int:
    out = Path(os.environ[OUT])
    timeline = Timeline()
    finished: list[cProfile.Profile] = []  # the profiles of threads that ended (see below)
    original = threading.Thread.run

    def run(thread: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        try:
            original(thread)
        finally:
            profile.disable()
            finished.append(profile)

    threading.Thread.run = run  # type: ignore[method-assign]
    loop = cProfile.Profile(time.thread_time)
    try:
        with timeline.hooked(), timeline.recording():
            loop.enable()
            try:
                return relay_main(argv)
            finally:
                loop.disable()
    finally:
        # Only threads that ended: a profile read while its thread still runs (pymongo's monitors,
        # daemons) closes that thread's calls in progress with this thread's CPU clock.
        stats = pstats.Stats(loop)
        for profile in list(finished):
            stats.add(profile)
        stats.dump_stats(str(out.with_suffix(".pstats")))
        out.with_suffix(".txt").write_text("\n".join(timeline.format()) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

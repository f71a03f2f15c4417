"""Profile the relay's catch-up: where its CPU goes, beside the bare relay on the same backlog.

Run: `.venv/bin/python -m bench.profile [--events N] [--variant default|2kb|20kb|typed]
[--top 30] [--no-profile] [--where] [--repeat R] [--config NAME:KEY=VALUE,KEY=VALUE ...]`.

Each `--config` is one relay configuration to measure, by name, as RELAY_* variables
(`depth2:RELAY_PIPELINE_DEPTH=2`, `nolinger:RELAY_KAFKA_LINGER_MS=0`, `eos:RELAY_DELIVERY=exactly-once`,
which runs bench.scenarios.catch_up's exactly-once mode); `python:` (no variables)
is the Python path without the compiled encoder. The default is just the relay's defaults.
Configurations alternate within each repeat, so the machine's load drifts over all of them.

On a fresh local stack: write a backlog, then (R times) drain it with the relay, the bare relay
(bench/scenarios/bare_relay.py) and the bare change stream, printing events/s and the CPU microseconds per event
of this process (the relay, its librdkafka threads included) and of mongod and Kafka. With the
profile on, the relay's loop thread runs under cProfile (which slows it: read the rates of a run
without it) and the top functions by own time and by cumulative time are printed. CPU per event
is the figure to compare between changes: unlike events/s it hardly moves with the machine's
other load. `--where` also says where each catch-up's time went (bench.timeline: the loop's waits
for reads, encoding, sending, acknowledgements, checkpoints, and how much of the time mongod was
reading for the relay).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import threading
import uuid
from contextlib import ExitStack
from typing import Any

from pymongo import MongoClient

from bench.common import progress, warm_up_kafka
from bench.events import variants
from bench.relay_under_test import relay_settings
from bench.scenarios.backlog import write_backlog
from bench.scenarios.bare_relay import bare_relay
from bench.scenarios.catch_up import relay_catch_up
from bench.scenarios.change_stream import bare_change_stream
from bench.timeline import Timeline
from relay.dev.stack import LocalStack


class _ProfiledThreads:
    """Runs cProfile in every thread named relay-* started while active (the relay's loop)."""

    def __init__(self) -> None:
        self.stats: list[cProfile.Profile] = []
        self._original = threading.Thread.run

    def __enter__(self) -> _ProfiledThreads:
        profiles, original = self.stats, self._original

        def run(thread: threading.Thread) -> None:
            if not thread.name.startswith("relay-"):
                return original(thread)
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()
            try:
                return original(thread)
            finally:
                profile.disable()

        threading.Thread.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        threading.Thread.run = self._original  # type: ignore[method-assign]

    def report(self, top: int) -> str:
        if not self.stats:
            return "(no relay thread profiled)"
        out = io.StringIO()
        stats = pstats.Stats(self.stats[0], stream=out)
        for more in self.stats[1:]:
            stats.add(more)
        stats.strip_dirs().sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        return out.getvalue()


def _config(text: str) -> tuple[str, dict[str, str], bool]:
    name, _, rest = text.partition(":")
    env = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, env, name != "python"


def _print(row: Any) -> None:
    print(f"{row.scenario:<28} {row.events_per_s:>9,.0f} events/s  "
          f"{row.cpu_us_per_event:6.1f} µs/event here  "
          f"{row.mongod_cpu_us_per_event:6.1f} mongod  "
          f"{row.extra.get('kafka_cpu_us_per_event', float('nan')):6.1f} kafka  "
          f"other load {row.other_cores:.2f} cores", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--variant", default="default", choices=["default", "2kb", "20kb", "typed"])
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--where", action="store_true", help="time the loop's parts and the reads (bench.timeline)")
    p.add_argument("--config", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="a relay configuration to measure (repeatable; default: the defaults)")
    args = p.parse_args(argv)
    configs = [_config(text) for text in args.config] or [("defaults", {}, True)]
    timeline = Timeline() if args.where else None  # before any client is built: it monitors their commands
    variant = next(v for v in variants(args.events, 200, True, True) if v.key == args.variant)
    stack = LocalStack.in_temp_dir()
    stack.start()
    try:
        client: MongoClient[Any] = MongoClient(stack.mongo.uri, tz_aware=True)
        warm_up_kafka(stack.kafka.bootstrap_servers)
        run_id = uuid.uuid4().hex[:6]
        backlog = write_backlog(client, f"profile_{run_id}", variant)
        for attempt in range(args.repeat):
            for name, env, native in configs:
                tag = f"{run_id}{attempt}{name}"
                env = {**env, "RELAY_LEASE_COLLECTION": f"leases_{tag}"}  # a fresh start each run
                delivery = env.pop("RELAY_DELIVERY", "at-least-once")  # with its own offsets topic per run
                progress(f"run {attempt + 1}, {name}")
                with ExitStack() as around:
                    profiled = around.enter_context(_ProfiledThreads()) if args.profile else None
                    if timeline is not None:
                        around.enter_context(timeline.hooked())
                        around.enter_context(timeline.recording())
                    row = relay_catch_up(stack, client, backlog, tag, env=env, native=native, delivery=delivery,
                                         in_process=True)  # cProfile and the timeline watch this process
                if profiled is not None:
                    print(profiled.report(args.top))
                if timeline is not None:
                    print("\n".join(timeline.format()))
                row.scenario = f"relay [{name}]"
                _print(row)
            settings = relay_settings(stack, backlog.database, "unused", "now")
            _print(bare_relay(stack, client, backlog, settings, f"profile.{run_id}{attempt}.bare"))
            _print(bare_change_stream(stack, client, backlog))
        client.close()
    finally:
        stack.stop()
        shutil.rmtree(stack.base_dir, ignore_errors=True)
    progress("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

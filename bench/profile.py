"""Profile the relay's catch-up: where its CPU goes, beside the bare relay on the same backlog.

Run: `.venv/bin/python -m bench.profile [--events N] [--variant default|2kb|20kb|typed]
[--top 30] [--no-profile] [--where] [--process] [--repeat R] [--config NAME:KEY=VALUE,KEY=VALUE ...]`.

`--process` profiles the relay as deployed instead: `outbox-relay run` in a process of its own
(bench.profiled_relay: every thread under cProfile timed by thread CPU time, and bench.timeline's
waits), draining the backlog; it prints the CPU per event of each stage of the loop (reading,
the read-ahead thread, encoding, sending, waiting for acknowledgements, storing checkpoints),
the process's CPU per event from its first event on, mongod's and the broker's, and where the
loop's wall time went; then the bare relay and the bare change stream, each its own process, on
the same backlog. (`python:` does not apply there: the process builds with the compiled encoder.)

`--broker nats` runs the relay to NATS JetStream instead (RELAY_BROKER=nats, on a nats-server the
stack starts too; issue 51), beside the bare relay to NATS (bench/scenarios/bare_nats.py); with
`--process` its stages are the NATS publisher's, and the event loop thread that puts messages on the
wire and takes their PubAcks (nats-py) is profiled with the others.

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
import tempfile
import threading
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import progress
from bench.events import variants
from bench.profiled_relay import OUT
from bench.relay_under_test import relay_settings
from bench.scenarios.backlog import write_backlog
from bench.scenarios.bare_nats import bare_nats_relay
from bench.scenarios.bare_relay import bare_relay
from bench.scenarios.catch_up import relay_catch_up
from bench.scenarios.change_stream import bare_change_stream
from bench.stack import bench_stack
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


STAGES = [  # (stage, file, function): the loop's calls and the reader thread, as bench.timeline names them
    ("reading (loop: next_batch)", "stream.py", "next_batch"),
    ("read-ahead thread (getMore, decode)", "stream.py", "_run"),
    ("encoding (build_many)", "encoding.py", "build_many"),
    ("sending (produce)", "producer.py", "send"),
    ("acknowledgements (drain, poll)", "producer.py", "drain"),
    ("", "producer.py", "poll"),
    ("storing checkpoints", "lease.py", "store_checkpoint"),
]
NATS_STAGES = [  # the same for RELAY_BROKER=nats: relay/nats/publisher.py, and the event loop thread (nats-py)
    ("reading (loop: next_batch)", "stream.py", "next_batch"),
    ("read-ahead thread (getMore, decode)", "stream.py", "_run"),
    ("encoding (build_many)", "encoding.py", "build_many"),
    ("sending (to_nats, hand to the loop)", "nats/publisher.py", "send"),
    ("acknowledgements (drain, poll)", "nats/publisher.py", "drain"),
    ("", "nats/publisher.py", "poll"),
    ("storing checkpoints", "lease.py", "store_checkpoint"),
    ("event loop: publishing (Sender._publish)", "nats/publisher.py", "_publish"),
    ("  of which nats-py publish_async", "js/client.py", "publish_async"),
    ("event loop: PubAcks (_acknowledged)", "nats/publisher.py", "_acknowledged"),
    ("event loop: reading replies (nats-py)", "aio/client.py", "_read_loop"),
    ("event loop: writing (nats-py flusher)", "aio/client.py", "_flusher"),
]


def stage_cpu(stats: pstats.Stats, events: int, stages: list[tuple[str, str, str]] = STAGES
              ) -> list[tuple[str, float, float]]:
    """(stage, CPU s, µs per event) from a thread-CPU profile: each stage's functions' cumulative
    time (a stage named "" adds to the one before it)."""
    rows: list[tuple[str, float, float]] = []
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for stage, file, function in stages:
        seconds = sum(v[3] for (path, _line, name), v in table.items() if path.endswith(file) and name == function)
        if not stage and rows:
            name, before, _ = rows[-1]
            rows[-1] = (name, before + seconds, (before + seconds) / events * 1e6)
        else:
            rows.append((stage, seconds, seconds / events * 1e6))
    return rows


def _profiled_process(stack: LocalStack, client: Any, backlog: Any, tag: str, env: dict[str, str], delivery: str,
                      name: str, top: int, broker: str = "kafka") -> Any:
    """One catch-up by the profiled relay process (bench.profiled_relay); prints its stages."""
    out = Path(tempfile.mkdtemp(prefix="bench-profile-")) / "relay"
    row = relay_catch_up(stack, client, backlog, tag, env=env, delivery=delivery, module="bench.profiled_relay",
                         process_env={OUT: str(out)}, broker=broker)
    row.scenario = f"relay process [{name}]"
    stats = pstats.Stats(str(out.with_suffix(".pstats")))
    print(f"CPU per event by stage, {backlog.events:,} events (thread CPU under cProfile, which inflates it; "
          f"the process: {row.cpu_us_per_event:.1f} µs/event from its first event on)")
    for stage, seconds, per_event in stage_cpu(stats, backlog.events, NATS_STAGES if broker == "nats" else STAGES):
        print(f"  {stage:<40} {seconds:7.2f} s {per_event:7.1f} µs/event")
    print(out.with_suffix(".txt").read_text().rstrip())
    if top:
        text = io.StringIO()
        stats.stream = text  # type: ignore[attr-defined]
        stats.strip_dirs().sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        print(text.getvalue())
    shutil.rmtree(out.parent, ignore_errors=True)
    return row


def _print(row: Any) -> None:
    print(f"{row.scenario:<28} {row.events_per_s:>9,.0f} events/s  "
          f"{row.cpu_us_per_event:6.1f} µs/event here  "
          f"{row.mongod_cpu_us_per_event:6.1f} mongod  "
          f"{row.extra.get('kafka_cpu_us_per_event', float('nan')):6.1f} kafka  "
          f"{row.extra.get('nats_cpu_us_per_event', float('nan')):6.1f} nats  "
          f"other load {row.other_cores:.2f} cores", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--variant", default="default", choices=["default", "2kb", "20kb", "typed"])
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--where", action="store_true", help="time the loop's parts and the reads (bench.timeline)")
    p.add_argument("--process", action="store_true",
                   help="profile the relay as its own process (bench.profiled_relay), CPU per event by stage")
    p.add_argument("--config", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="a relay configuration to measure (repeatable; default: the defaults)")
    p.add_argument("--broker", default="kafka", choices=["kafka", "nats"],
                   help="the relay's broker (nats: RELAY_BROKER=nats on a nats-server of the stack, beside the "
                        "bare relay to NATS; issue 51)")
    args = p.parse_args(argv)
    configs = [_config(text) for text in args.config] or [("defaults", {}, True)]
    timeline = Timeline() if args.where else None  # before any client is built: it monitors their commands
    variant = next(v for v in variants(args.events, 200, True, True) if v.key == args.variant)
    nats = args.broker == "nats"
    with bench_stack(nats=nats) as (stack, client):
        run_id = uuid.uuid4().hex[:6]
        backlog = write_backlog(client, f"profile_{run_id}", variant)
        for attempt in range(args.repeat):
            for name, env, native in configs:
                tag = f"{run_id}{attempt}{name}"
                env = {**env, "RELAY_LEASE_COLLECTION": f"leases_{tag}"}  # a fresh start each run
                delivery = env.pop("RELAY_DELIVERY", "at-least-once")  # with its own offsets topic per run
                progress(f"run {attempt + 1}, {name}")
                if args.process:
                    _print(_profiled_process(stack, client, backlog, tag, env, delivery, name, args.top
                                             if args.profile else 0, args.broker))
                    continue
                with ExitStack() as around:
                    profiled = around.enter_context(_ProfiledThreads()) if args.profile else None
                    if timeline is not None:
                        around.enter_context(timeline.hooked())
                        around.enter_context(timeline.recording())
                    row = relay_catch_up(stack, client, backlog, tag, env=env, native=native, delivery=delivery,
                                         in_process=True, broker=args.broker)  # cProfile and the timeline watch it
                if profiled is not None:
                    print(profiled.report(args.top))
                if timeline is not None:
                    print("\n".join(timeline.format()))
                row.scenario = f"relay [{name}]"
                _print(row)
            settings = relay_settings(stack, backlog.database, "unused", "now")
            if nats:
                _print(bare_nats_relay(stack, client, backlog, settings, f"profile{run_id}{attempt}"))
            else:
                _print(bare_relay(stack, client, backlog, settings, f"profile.{run_id}{attempt}.bare"))
            _print(bare_change_stream(stack, client, backlog))
    progress("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

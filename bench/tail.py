"""What the relay's own share is made of at a steady rate, and what its tail waits for.

Run: `.venv/bin/python -m bench.tail [--rate 1000] [--batch 1] [--seconds 20] [--rounds 1]
[--delivery exactly-once] [--live-reader off|on|both]`.

The relay runs in this process on a fresh local stack while the writer (bench.writer, a child
process) commits at `--rate`, `--batch` events per transaction. Each parcel's own share
(`relay_read_to_ack_seconds`, read -> acknowledged) is split, from the relay's own observer hooks and
each message's delivery report (librdkafka's `latency()`, produce() -> the broker's ack reaching the
client), into: `before` (read -> parcel created: encoding, a lease renewal when due), `send`
(handing the messages to librdkafka), `ack` (until the last acknowledgement reached librdkafka:
the produce request's trip and the broker), `report` (until the loop served that report: the loop
thread waiting for the interpreter or a core), `notice` (until the loop went on). The report names
the part that dominates the parcels at or above p99. `--live-reader on` also runs, in this
process, the live read_committed consumer the benchmark's in-process latency step ran beside the
relay from ade8617 on (`both`: rounds alternate without and with it), to show what it costs.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient

from bench.common import percentile, progress
from bench.relay_under_test import lease_token_data, relay_settings, running_relay
from bench.stack import bench_stack
from bench.writer import receive, writer_child
from relay.core.window import Parcel
from relay.dev.stack import LocalStack

PARTS = ("before", "send", "ack", "report", "notice")


@dataclass
class Sample:
    """One parcel's own share and its parts, ms."""

    events: int
    own: float
    parts: dict[str, float]


@dataclass
class _Reports:
    """The delivery reports of one parcel: when the last ack reached librdkafka, when the last
    report was served (Unix seconds)."""

    last_ack: float = 0.0
    last_served: float = 0.0


@dataclass
class Timed:
    """Wraps one relay loop's observer hooks and the parcels' report callback (see above)."""

    samples: list[Sample] = field(default_factory=list)
    recording: bool = False
    _sends: dict[int, tuple[float, float]] = field(default_factory=dict)  # id(messages) -> send start, end
    _reports: dict[int, _Reports] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, observer: Any) -> None:
        published, watch = observer.published, observer.watch_publisher

        def on_published(wall_ms: Any, messages: Any, seconds: float, token: Any, read_seconds: float) -> None:
            published(wall_ms, messages, seconds, token, read_seconds)
            self.delivered(messages, seconds, read_seconds, time.time())

        def on_watch(publisher: Any) -> None:
            watch(publisher)
            send = publisher.send

            def timed_send(parcel: Any, while_waiting: Any) -> None:
                started = time.time()
                try:
                    send(parcel, while_waiting)
                finally:
                    self.sent(parcel.messages, started, time.time())

            publisher.send = timed_send

        observer.published, observer.watch_publisher = on_published, on_watch

    def sent(self, messages: Any, started: float, ended: float) -> None:
        """A parcel's messages were handed to librdkafka between `started` and `ended` (Unix s)."""
        self._sends[id(messages)] = (started, ended)

    def report(self, parcel: Parcel, msg: Any, served: float | None = None) -> None:
        """A delivery report (on the loop's thread, inside poll/flush): note its ack and serve time."""
        served = time.time() if served is None else served
        _kind, ms = msg.timestamp()
        latency = msg.latency()
        with self._lock:
            r = self._reports.setdefault(id(parcel.messages), _Reports())
            r.last_served = max(r.last_served, served)
            if latency is not None and ms > 0:
                r.last_ack = max(r.last_ack, ms / 1000 + latency)

    def delivered(self, messages: Any, seconds: float, read_seconds: float, done: float) -> None:
        """Every report of the parcel holding `messages` was served; the loop went on at `done`
        (`seconds` since it was created, `read_seconds` since its changes were read)."""
        start, end = self._sends.pop(id(messages), (done - seconds, done - seconds))
        with self._lock:
            r = self._reports.pop(id(messages), _Reports(done, done))
        if not self.recording:
            return
        ack = min(max(r.last_ack, end), done)
        served = min(max(r.last_served, ack), done)
        parts = {"before": read_seconds - seconds, "send": end - start, "ack": ack - end,
                 "report": served - ack, "notice": done - served}
        self.samples.append(Sample(len(messages), read_seconds * 1000, {k: v * 1000 for k, v in parts.items()}))


@contextmanager
def report_hook(timed: Timed) -> Iterator[None]:
    """Every parcel's report callback also tells `timed` (the class's method, for this run)."""
    original = Parcel.on_delivery

    def on_delivery(self: Parcel, err: Any, msg: Any) -> None:
        timed.report(self, msg)
        original(self, err, msg)

    Parcel.on_delivery = on_delivery  # type: ignore[method-assign]
    try:
        yield
    finally:
        Parcel.on_delivery = original  # type: ignore[method-assign]


@contextmanager
def live_reader(stack: LocalStack, topic: str) -> Iterator[None]:
    """What the benchmark's latency step ran beside the relay, in its process, from ade8617 on: a
    live read_committed consumer of its topic (fetch.wait.max.ms=5)."""
    from bench.scenarios.latency import LiveReader, relay_event_id

    live = LiveReader(stack.kafka.bootstrap_servers, topic, relay_event_id)
    try:
        yield
    finally:
        live.stop()


def _share(samples: list[Sample], part: str) -> float:
    total = sum(s.events for s in samples)
    return sum(s.parts[part] * s.events for s in samples) / total if total else float("nan")


def summary(samples: list[Sample], title: str) -> list[str]:
    """Own-share percentiles over events; the parts of the parcels at or above p99, of the median
    parcel; the worst parcels; and which part the tail waits for."""
    own = sorted(x for s in samples for x in [s.own] * s.events)
    if not own:
        return [f"{title}: no parcel recorded"]
    p99 = percentile(own, 99)
    tail = [s for s in samples if s.own >= p99]
    middle = sorted(samples, key=lambda s: s.own)[len(samples) // 2:][:1]
    lines = [f"{title}: {len(samples)} parcels ({sum(s.events for s in samples) / len(samples):.1f} events each); "
             f"own share p50 {percentile(own, 50):.1f} ms, p99 {p99:.1f} ms, max {own[-1]:.1f} ms"]
    for label, group in (("parcels at or above p99", tail), ("the median parcel", middle)):
        lines.append(f"  {label} ({len(group)}): " + ", ".join(f"{p} {_share(group, p):.2f}" for p in PARTS) + " ms")
    worst = sorted(samples, key=lambda s: -s.own)[:6]
    lines.append("  worst: " + "; ".join(f"{s.own:.0f} = " + "+".join(f"{s.parts[p]:.0f}" for p in PARTS)
                                         + f" ({s.events} ev)" for s in worst))
    top = max(PARTS, key=lambda p: _share(tail, p))
    lines.append(f"  the tail waits for: {top} ({_share(tail, top) / max(1e-9, sum(_share(tail, p) for p in PARTS)):.0%}"
                 f" of its own share; {MEANING[top]})")
    return lines


MEANING = {
    "before": "the loop between reading the changes and handing them over: encoding, a lease renewal",
    "send": "handing the messages to librdkafka",
    "ack": "the broker's acknowledgement: the produce request's trip and the broker's append",
    "report": "the relay's loop thread getting the interpreter and a core to serve a report librdkafka had",
    "notice": "the loop going on after the last report (exactly once: the transaction's commit)",
}


def one_round(stack: LocalStack, args: argparse.Namespace, live: bool) -> tuple[Timed, float]:
    """One relay, one writer, one database of its own; (the timed parcels, the writer's rate)."""
    timed = Timed()
    run_id = uuid.uuid4().hex[:6]
    database = f"tail_{run_id}"
    settings = relay_settings(stack, database, f"bench.{run_id}.{{aggregateType}}", "now")
    if args.delivery == "exactly-once":
        settings = settings.replace(delivery="exactly-once", offsets_topic=f"bench.{run_id}.offsets")
    with ExitStack() as on_exit:
        client: MongoClient[Any] = on_exit.enter_context(MongoClient(stack.mongo.uri, tz_aware=True))
        conn = on_exit.enter_context(writer_child(stack.mongo.uri, database, args.rate, args.seconds,
                                                  args.payload_bytes, args.batch))
        on_exit.enter_context(report_hook(timed))
        runner = on_exit.enter_context(running_relay(settings))
        [loop] = runner.relay.observer.loops.values()  # the one outbox's loop
        timed.watch(loop)
        runner.start()
        leases = client[database][settings.lease_collection]
        deadline = time.monotonic() + 60
        while not lease_token_data(leases, str(settings.namespaces[0]))[0] and time.monotonic() < deadline:
            time.sleep(0.1)
        if live:
            on_exit.enter_context(live_reader(stack, f"bench.{run_id}.bench"))
        receive(conn, 60, "ready")
        timed.recording = True
        conn.send("go")
        result = receive(conn, args.seconds * 3 + 120, "result")
        time.sleep(1.0)
        timed.recording = False
    admin: MongoClient[Any]
    with MongoClient(stack.mongo.uri) as admin:
        admin.drop_database(database)  # once the relay stopped (a drop ends its stream)
    return timed, len(result["committed"]) / result["seconds"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tail", description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--batch", type=int, default=1, help="events per transaction (default 1)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=1, help="rounds on one stack (default 1)")
    p.add_argument("--delivery", default="at-least-once", choices=["at-least-once", "exactly-once"])
    p.add_argument("--payload-bytes", type=int, default=200)
    p.add_argument("--live-reader", choices=["off", "on", "both"], default="off",
                   help="also run a live read_committed consumer of the relay's topic in this process "
                        "(both: rounds alternate without and with it)")
    args = p.parse_args(argv)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.live_reader]
    with bench_stack() as (stack, _client):
        for r in range(args.rounds):
            for live in modes[r % len(modes):] + modes[:r % len(modes)]:
                progress(f"round {r + 1}: {args.delivery}, {args.rate:g} events/s x{args.batch}, {args.seconds:g} s"
                         + (", live reader" if live else ""))
                timed, reached = one_round(stack, args, live)
                title = (f"round {r + 1}, {args.delivery} at {args.rate:g}/s x{args.batch}"
                         f"{' with a live reader' if live else ''} (writer reached {reached:,.0f}/s)")
                print("\n".join(summary(timed.samples, title)), flush=True)
    print("  parts: " + "; ".join(f"{p} = {MEANING[p]}" for p in PARTS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the relay's own share is made of at a steady rate: per delivery, the time from reading its
changes to Kafka's acknowledgement (`relay_read_to_ack_seconds`), split where the loop spends it.

Run: `.venv/bin/python -m bench.tail [--rate 1000] [--seconds 20] [--delivery exactly-once]`.

On a fresh local stack, the relay runs in this process (as in `bench.scenarios.latency`) while the
steady-state writer (bench.writer, a child process) commits one transaction per event at
`--rate`. The observer's reports are wrapped (an instance attribute of the relay's own observer,
no library's internals): `published` gives each delivery's own share and the time since it was
created, and the publisher's `send`, `poll` and `drain` are timed. Per delivery:

- before = read -> delivery created: the lease heartbeat (a renewal only when nothing was written
  to the lease document for RELAY_HEARTBEAT_INTERVAL_S) and encoding;
- send = handing the messages to librdkafka;
- wait = the rest until the acknowledgement: `drain` (librdkafka's flush: the produce request's
  round trip to the broker, acks=all), or in exactly-once mode the wait for the transaction's commit.

The getMore's wait on mongod comes before the read and is not part of the own share. The report
gives the percentiles of the own share over events, and what the deliveries at or above its p99
spent in each part, beside the median delivery.
"""

from __future__ import annotations

import argparse
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from bench.common import percentile, progress, warm_up_kafka
from bench.relay_under_test import lease_token_data, relay_settings, running_relay
from bench.writer import receive, writer_child
from relay.dev.stack import LocalStack


@dataclass
class Sample:
    events: int
    own_ms: float
    before_ms: float
    send_ms: float
    wait_ms: float


class Timed:
    """Wraps the relay's observer: times each delivery's parts (see the module docstring)."""

    def __init__(self, observer: Any) -> None:
        self.samples: list[Sample] = []
        self.send_s = 0.0
        self.recording = False
        published, watch = observer.published, observer.watch_publisher

        def on_published(wall_ms: Any, messages: Any, seconds: float, token: Any, read_seconds: float) -> None:
            published(wall_ms, messages, seconds, token, read_seconds)
            if self.recording:
                send = min(self.send_s, seconds)
                self.samples.append(Sample(len(messages), read_seconds * 1000, (read_seconds - seconds) * 1000,
                                           send * 1000, (seconds - send) * 1000))
            self.send_s = 0.0

        def on_watch(publisher: Any) -> None:
            watch(publisher)
            send = publisher.send

            def timed_send(delivery: Any, while_waiting: Any) -> None:
                started = time.monotonic()
                try:
                    send(delivery, while_waiting)
                finally:
                    self.send_s += time.monotonic() - started

            publisher.send = timed_send

        observer.published, observer.watch_publisher = on_published, on_watch


def _share(samples: list[Sample], part: str) -> float:
    total = sum(s.events for s in samples)
    return sum(getattr(s, part) * s.events for s in samples) / total if total else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--delivery", default="at-least-once", choices=["at-least-once", "exactly-once"])
    p.add_argument("--payload-bytes", type=int, default=200)
    args = p.parse_args(argv)
    stack = LocalStack.in_temp_dir()
    stack.start()
    try:
        warm_up_kafka(stack.kafka.bootstrap_servers)
        run_id = uuid.uuid4().hex[:6]
        database = f"tail_{run_id}"
        settings = relay_settings(stack, database, f"bench.{run_id}.{{aggregateType}}", "now")
        if args.delivery == "exactly-once":
            settings = settings.replace(delivery="exactly-once", offsets_topic=f"bench.{run_id}.offsets")
        client: MongoClient[Any] = MongoClient(stack.mongo.uri, tz_aware=True)
        with writer_child(stack.mongo.uri, database, args.rate, args.seconds, args.payload_bytes, 1) as conn, \
                running_relay(settings) as runner:
            [loop] = runner.relay.observer.loops.values()  # the one outbox's loop
            timed = Timed(loop)
            runner.start()
            leases = client[database][settings.lease_collection]
            deadline = time.monotonic() + 60
            while not lease_token_data(leases, settings.namespace)[0] and time.monotonic() < deadline:
                time.sleep(0.1)
            receive(conn, 60, "ready")
            timed.recording = True
            progress(f"{args.delivery}: {args.rate:g} events/s for {args.seconds:g} s")
            conn.send("go")
            result = receive(conn, args.seconds * 3 + 120, "result")
            time.sleep(1.0)
            timed.recording = False
        client.close()
    finally:
        stack.stop()
        shutil.rmtree(stack.base_dir, ignore_errors=True)
    samples = timed.samples
    own = sorted(x for s in samples for x in [s.own_ms] * s.events)
    p99 = percentile(own, 99)
    tail = [s for s in samples if s.own_ms >= p99]
    middle = sorted(samples, key=lambda s: s.own_ms)[len(samples) // 2 : len(samples) // 2 + 1]
    print(f"{args.delivery} at {args.rate:g}/s: {len(result['committed'])} events written, {len(samples)} deliveries "
          f"({sum(s.events for s in samples) / max(1, len(samples)):.1f} events each); own share p50 "
          f"{percentile(own, 50):.1f} ms, p99 {p99:.1f} ms, max {own[-1] if own else float('nan'):.1f} ms")
    for label, group in (("deliveries at or above p99", tail), ("the median delivery", middle)):
        print(f"  {label} ({len(group)}): before {_share(group, 'before_ms'):.2f} ms (heartbeat, encoding), "
              f"send {_share(group, 'send_ms'):.2f} ms, wait {_share(group, 'wait_ms'):.2f} ms (drain / commit)")
    worst = sorted(samples, key=lambda s: -s.own_ms)[:8]
    print("  worst: " + "; ".join(f"{s.own_ms:.1f} = {s.before_ms:.1f}+{s.send_ms:.1f}+{s.wait_ms:.1f} "
                                  f"({s.events} ev)" for s in worst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Baseline: a bare confluent-kafka producer with the relay's configuration, pre-encoded messages."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Message, Producer

from bench.common import AGGREGATES, Row, create_topic, rate
from bench.events import aggregate_id
from bench.sampling import Sampler, stack_roles
from relay.config import Settings
from relay.dev.stack import LocalStack


def bare_producer(stack: LocalStack, settings: Settings, sample: Message, events: int, topic: str,
                  variant: str = "") -> Row:
    """N copies of one relay message (same value, headers; keys over the same AGGREGATES ids)
    to a fresh topic with the same partition count, through `Settings.parts().kafka.producer_config()`
    (idempotence, acks=all, linger.ms=5, lz4), then flush. Counts only successful deliveries."""
    create_topic(stack.kafka.bootstrap_servers, topic)
    value, headers = sample.value(), sample.headers() or []
    keys = [aggregate_id(i).encode() for i in range(AGGREGATES)]
    producer = Producer(settings.parts().kafka.producer_config())
    outcome = {"ok": 0, "failed": 0}

    def on_delivery(err: Any, _msg: Any) -> None:
        outcome["failed" if err is not None else "ok"] += 1

    produce, poll = producer.produce, producer.poll
    with Sampler(stack_roles(stack)) as sampler:
        started = time.perf_counter()
        for i in range(events):
            while True:
                try:
                    produce(topic, value, keys[i % AGGREGATES], headers=headers, on_delivery=on_delivery)
                    break
                except BufferError:
                    poll(0.05)
            poll(0)
        while producer.flush(1.0) > 0:
            pass
        seconds = time.perf_counter() - started
    usage = sampler.stop()
    if outcome["failed"]:
        raise RuntimeError(f"producer baseline: {outcome['failed']} deliveries failed")
    return Row("baseline: bare producer", outcome["ok"], seconds, rate(outcome["ok"], seconds), variant=variant,
               cpu_us_per_event=usage.cpu_us_per_event("bench", outcome["ok"]),
               peak_rss_mb=usage.peak_rss_mb.get("bench", float("nan")), other_cores=usage.other_cores,
               iowait_cores=usage.iowait_cores,
               note=f"relay's config, value {len(value or b'')} B + {len(headers)} headers")

"""Relay catch-up: the relay as deployed (`outbox-relay run`, a process of its own) drains a backlog.

Timed by bench.scenarios.drain's rule, as every contestant: from its first message's append time
in the topic to its last one, start-up (launch to first message) reported apart. The run ends once
the stored checkpoint covers the backlog and every event is in Kafka. `in_process=True` builds the
relay in a thread of this process instead (bench.profile, which profiles that thread): its CPU and
RSS are then this process's, harness included. `broker="nats"`: the relay to NATS JetStream, into a
stream of its own, timed by its stored times; `broker="rabbitmq"`: the relay to RabbitMQ, into an
exchange and quorum queue of its own, timed by the queue's depth (bench.scenarios.drain.Output
says how each is read).
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, Row, log, wait_for, warm_up_transactions
from bench.relay_under_test import lease_token_data, relay_settings, running_relay
from bench.sampling import Sampler, Usage, self_peak_rss_mb, stack_roles
from bench.scenarios.backlog import Backlog
from bench.scenarios.drain import CpuAtFirst, Output, Span, TopicOutput, rate_of
from bench.stack import nats_url, rabbitmq_url
from harness.relays import RelayProcess
from relay.config import Settings
from relay.dev.stack import LocalStack


@dataclass
class _Drained:
    """What a catch-up measured: its time, the process's usage, the messages in Kafka."""

    span: Span
    usage: Usage
    role: str                    # the Sampler's role of the relay: "relay" (its process) or "bench" (this one)
    at_first: CpuAtFirst
    at_checkpoint: int
    final: int


def relay_catch_up(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, run_id: str,
                   label: str = "relay catch-up (to checkpoint)", delivery: str = "at-least-once",
                   env: dict[str, str] | None = None, native: bool = True, in_process: bool = False,
                   module: str = "relay", process_env: dict[str, str] | None = None, broker: str = "kafka") -> Row:
    """Start the relay on the backlog; run it until a checkpoint covers the last backlog event.

    Done-condition: the lease document's `resumeToken._data` >= the `_data` of the last
    backlog event's own resume token. Resume tokens' `_data` is the hex of a KeyString
    whose order is the stream's order (cluster time first; at an equal cluster time a
    high-water-mark token sorts before the event), so a stored token strictly before the
    last event's token cannot cover it, and one at or past it covers every backlog event.
    The time is the topic's span (bench.scenarios.drain), start-up apart.

    The relay promises to store a token only after Kafka acknowledged every event before
    it, so at that moment the topic must already hold all N messages (acks=all: the high
    watermark has moved before the ack). The benchmark checks this instead of trusting it:
    if fewer are there, the row says so and the time runs until the last message is in Kafka.

    `delivery="exactly-once"` runs the relay with RELAY_DELIVERY=exactly-once (Kafka transactions
    spanning reads, bench.scenarios.exactly_once); the messages are then counted as a read_committed
    consumer reads them (the watermarks also count commit markers), after the sampled interval.
    `module` and `process_env`: what `python -m <module> run` starts, with these variables too
    (bench.profiled_relay, the relay with a profiler inside, for `bench.profile --process`).

    `broker="nats"` runs the relay with RELAY_BROKER=nats on the stack's nats-server
    (bench.stack.BenchStack), into a stream of its own created before it starts
    (bench.jetstream.StreamOutput): counted by the stream's stored messages, timed by their stored
    times, the same done-condition; the stream is deleted once measured. `broker="rabbitmq"` runs it
    with RELAY_BROKER=rabbitmq on the stack's rabbitmq-server, to an exchange of its own with a
    quorum queue bound with `#` (bench.rabbitmq.QueueOutput): counted by the queue's depth, timed
    by its changes; both deleted once measured (at-least-once only: RabbitMQ refuses exactly-once).
    """
    exactly_once = delivery == "exactly-once"
    name = f"catchup-eos-{backlog.variant.key}" if exactly_once else f"catchup-{backlog.variant.key}"
    if broker != "kafka":
        name = f"{broker}-{name}"
    topic_template = f"bench.{run_id}.{name}.{{aggregateType}}"
    topic = topic_template.format(aggregateType=AGGREGATE_TYPE)
    start_at = dt.datetime.fromtimestamp(backlog.before.time, dt.UTC).isoformat()
    settings = relay_settings(stack, backlog.database, topic_template, start_at, env)
    output: Output
    if broker == "nats":
        from bench.jetstream import StreamOutput, stream_name

        output = StreamOutput(nats_url(stack), stream_name("bench", run_id, name), [f"bench.{run_id}.{name}.>"])
        settings = settings.replace(broker="nats", nats_servers=output.url, nats_stream=output.stream,
                                    delivery=delivery)
    elif broker == "rabbitmq":
        from bench.rabbitmq import QueueOutput, amqp_name

        output = QueueOutput(rabbitmq_url(stack), amqp_name("bench", run_id, name), amqp_name("bench", run_id, name))
        settings = settings.replace(broker="rabbitmq", rabbitmq_url=output.url, rabbitmq_exchange=output.exchange)
    else:
        output = TopicOutput(stack.kafka.bootstrap_servers, topic, committed=exactly_once)
    output.prepare()
    if exactly_once and broker == "kafka":
        # A lease document of its own: in the at-least-once run's, the checkpoint already covers
        # the backlog (and the relay would resume after it, as a switch of modes does).
        settings = settings.replace(delivery=delivery, offsets_topic=f"bench.{run_id}.offsets-{backlog.variant.key}",
                                    lease_collection=f"{settings.lease_collection}_exactly_once")
        warm_up_transactions(stack.kafka.bootstrap_servers)
    elif exactly_once:
        settings = settings.replace(lease_collection=f"{settings.lease_collection}_exactly_once")
    try:
        drained = _drain(stack, client, backlog, settings, output, label,
                         _launcher(settings, native, in_process, module, process_env))
    finally:
        output.discard()
    row = _row(label, backlog, drained, topic, exactly_once, broker)
    if broker == "nats":
        row.extra["stream"] = getattr(output, "stream", None)
    if broker == "rabbitmq":
        row.extra["queue"] = getattr(output, "queue", None)
    return row


class _Launched:
    """The relay under test, started: its Sampler roles, a liveness check, a stop."""

    def __init__(self, settings: Settings, native: bool, in_process: bool, module: str = "relay",
                 process_env: dict[str, str] | None = None) -> None:
        self.role = "bench" if in_process else "relay"
        self._thread = running_relay(settings, native) if in_process else None
        self._logs = Path(tempfile.mkdtemp(prefix="bench-relay-"))  # deleted on stop (check_alive shows the end)
        self._process = None if in_process else RelayProcess(settings, self._logs, "relay", process_env, module)
        self._runner: Any = None

    def roles(self) -> dict[str, int | None]:
        proc = self._process.proc if self._process is not None else None
        return {"relay": proc.pid} if proc is not None else {}

    def start(self) -> None:
        if self._thread is not None:
            self._runner = self._thread.__enter__()
            self._runner.start()
        else:
            assert self._process is not None
            self._process.start()

    def check_alive(self) -> None:
        if self._runner is not None:
            self._runner.check_alive()
        elif self._process is not None and not self._process.alive:
            raise RuntimeError(f"the relay process ended: {self._process.log()[-3000:]}")

    def stop(self) -> None:
        if self._thread is not None and self._runner is not None:
            self._thread.__exit__(None, None, None)
        if self._process is not None:
            self._process.stop()
        shutil.rmtree(self._logs, ignore_errors=True)


def _launcher(settings: Settings, native: bool, in_process: bool, module: str,
              process_env: dict[str, str] | None) -> Callable[[], _Launched]:
    return lambda: _Launched(settings, native, in_process, module, process_env)


def _drain(stack: LocalStack, client: MongoClient[Any], backlog: Backlog, settings: Settings, output: Output,
           label: str, launch: Callable[[], _Launched]) -> _Drained:
    """Run the relay until a checkpoint covers the backlog and `output` holds it (see `relay_catch_up`)."""
    leases = client[backlog.database][settings.lease_collection]

    def covered() -> bool:
        at_first.poll()
        data, _at = lease_token_data(leases, str(settings.namespaces[0]))
        return data is not None and data >= backlog.last_token_data

    relay = launch()
    with output.opened():
        at_first = CpuAtFirst(lambda: relay.roles().get("relay"), output.delivered)
        try:
            with Sampler(stack_roles(stack, relay.roles)) as sampler:
                launched = time.time()
                relay.start()
                wait_for(f"{label} ({backlog.variant.key})", covered, max(120.0, backlog.events / 500),
                         relay.check_alive)
                at_checkpoint = output.count()
                if at_checkpoint < backlog.events:
                    log.error("catch-up: the checkpoint covered the backlog while only %d of %d events "
                              "were delivered", at_checkpoint, backlog.events)
                    wait_for("catch-up events delivered", lambda: output.count() >= backlog.events, 120,
                             relay.check_alive)
                usage = sampler.stop()
        finally:
            relay.stop()
        final = output.count()
        span = output.span(launched)
    return _Drained(span, usage, relay.role, at_first, at_checkpoint, final)


def _row(label: str, backlog: Backlog, d: _Drained, topic: str, exactly_once: bool, broker: str = "kafka") -> Row:
    note = f"first to last message; start-up {d.span.start_up_s:.1f} s apart (and its CPU)"
    if broker == "nats":
        note += "; JetStream, Nats-Msg-Id within the duplicate window" if exactly_once else "; JetStream"
    elif broker == "rabbitmq":
        note += "; RabbitMQ quorum queue, publisher confirms, timed by its depth"
    else:
        note += "; Kafka transactions spanning reads" if exactly_once else ""
    where = {"nats": "stream", "rabbitmq": "queue"}.get(broker, "topic")
    if d.at_checkpoint < backlog.events:
        note += f"; CHECKPOINT AHEAD OF {broker.upper()} ({d.at_checkpoint} in {where})"
    if d.final != backlog.events:
        note += f"; {d.final} messages in {where}"
    usage, n, who = d.usage, backlog.events, d.role
    return Row(label, n, d.span.drain_s, rate_of(n, d.span), variant=backlog.variant.key, kind="relay",
               cpu_us_per_event=(d.at_first.per_event_us(usage.cpu_s.get(who, math.nan), n) if who == "relay"
                                 else usage.cpu_us_per_event(who, n)),
               mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", n),
               peak_rss_mb=usage.peak_rss_mb.get(who, float("nan")),
               other_cores=usage.other_cores, iowait_cores=usage.iowait_cores, note=note,
               extra={"topic": topic, "in_kafka_at_checkpoint": d.at_checkpoint, "in_kafka_final": d.final,
                      "start_up_s": d.span.start_up_s, "process": who, "start_up_cpu_s": d.at_first.cpu_s,
                      "rss_before_mb": usage.rss_start_mb.get(who), "rss_after_mb": usage.rss_end_mb.get(who),
                      "ru_maxrss_mb": self_peak_rss_mb() if who == "bench" else None, "cpu_s": usage.cpu_s,
                      "kafka_cpu_us_per_event": usage.cpu_us_per_event("kafka", n),
                      "nats_cpu_us_per_event": usage.cpu_us_per_event("nats", n),
                      "rabbitmq_cpu_us_per_event": usage.cpu_us_per_event("rabbitmq", n), "broker": broker})

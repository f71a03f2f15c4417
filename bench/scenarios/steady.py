"""Latency on equal terms: the steady-state steps, each in rotated rounds, with medians and ranges.

A step is a rate and how many events each of the writer's transactions holds (one per write, or a
batch). For each step and each of `rounds` rounds, every contender runs once
(bench.scenarios.latency.steady_state), in an order rotated by one every round (and by the step),
each after mongod and the broker are idle (bench.sampling.wait_idle), on a database and a topic of
its own. The contenders: the relay as deployed (`outbox-relay run` in a process of its own,
bench.relay_process; optionally in exactly-once mode) and each Kafka Connect peer at its defaults
and tuned by its documentation, each in its own JVM. `bench.ab` uses the same rounds with relays
from two code trees instead.

A round whose writer missed its target by more than 5% measured a saturated machine: it is shown,
marked, and left out of the medians that ratios and goals use (`Summary`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from pymongo import MongoClient

from bench.common import AGGREGATE_TYPE, log, progress, wait_for
from bench.events import EventFactory
from bench.relay_process import ROOT, RelayChild
from bench.relay_under_test import lease_token_data
from bench.sampling import wait_idle
from bench.scenarios.latency import Contender, Latency, Running, failed, peer_event_id, relay_event_id, steady_state
from bench.stack import nats_url, rabbitmq_url
from relay.dev.stack import LocalStack

Maker = Callable[[str], Contender]  # database -> a contender on it


@dataclass(frozen=True)
class Step:
    """A steady-state step: events per second, written `batch` per transaction."""

    rate: float
    batch: int

    @property
    def label(self) -> str:
        per = "one transaction per event" if self.batch == 1 else f"{self.batch} events per transaction"
        return f"{self.rate:,.0f} events/s, {per}"


def parse_steps(text: str) -> list[Step]:
    """`RATE[xBATCH],...` (e.g. `500,1000x10,10000x100`; no batch: one event per transaction)."""
    steps = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        rate, _, batch = part.partition("x")
        steps.append(Step(float(rate), int(batch) if batch else 1))
    if not steps or any(s.rate <= 0 or s.batch < 1 for s in steps):
        raise ValueError(f"steps: RATE[xBATCH],... with RATE > 0 and BATCH >= 1 expected, got {text!r}")
    return steps


@dataclass
class Summary:
    """One contender at one step over its rounds: medians and ranges of the rounds whose writer
    reached its target (`counted`); every round is kept in `rounds`."""

    contender: str
    step: Step
    rounds: list[Latency] = field(default_factory=list)
    strict: bool = True  # False: every round that did not fail counts (an A/B compares code, not rates)

    @property
    def counted(self) -> list[Latency]:
        return [x for x in self.rounds if (x.reached if self.strict else not x.error)]

    def median(self, attr: str) -> float:
        values = [getattr(x, attr) for x in self.counted if not math.isnan(getattr(x, attr))]
        return statistics.median(values) if values else math.nan

    def span(self, attr: str) -> tuple[float, float]:
        values = [getattr(x, attr) for x in self.counted if not math.isnan(getattr(x, attr))]
        return (min(values), max(values)) if values else (math.nan, math.nan)


def summarize(results: list[tuple[Step, Latency]], strict: bool = True) -> list[Summary]:
    """Group each round's result by step and contender, in the order first seen."""
    out: dict[tuple[Step, str], Summary] = {}
    for step, x in results:
        out.setdefault((step, x.contender), Summary(x.contender, step, strict=strict)).rounds.append(x)
    return list(out.values())


def relay_maker(stack: LocalStack, client: MongoClient[Any], run_id: str, delivery: str = "at-least-once",
                code: Path = ROOT, label: str | None = None, broker: str = "kafka") -> Maker:
    """The relay as deployed (bench.relay_process) from `code`, on the given database; with
    `broker="nats"` to the stack's nats-server (RELAY_BROKER=nats), into a stream of its own
    created before it starts (bench.jetstream.StreamSink); with `broker="rabbitmq"` to the stack's
    rabbitmq-server, to an exchange and quorum queue of its own consumed live
    (bench.rabbitmq.QueueSink)."""
    def make(database: str) -> Contender:
        topic_template = f"bench.{run_id}.{database}.{{aggregateType}}"
        env = {"RELAY_MONGODB_URI": stack.mongo.uri, "RELAY_KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
               "RELAY_DATABASE": database, "RELAY_TOPIC_TEMPLATE": topic_template, "RELAY_START_AT": "now",
               "RELAY_INSTANCE_ID": f"bench-{database}"}
        if delivery == "exactly-once":
            env |= {"RELAY_DELIVERY": delivery, "RELAY_OFFSETS_TOPIC": f"bench.{run_id}.{database}.offsets"}
        sink = None
        if broker == "nats":
            from bench.jetstream import StreamSink, stream_name

            sink = StreamSink(nats_url(stack), stream_name("bench", run_id, database),
                              [f"bench.{run_id}.{database}.>"])
            env |= {"RELAY_BROKER": "nats", "RELAY_NATS_SERVERS": sink.url, "RELAY_NATS_STREAM": sink.stream}
        elif broker == "rabbitmq":
            from bench.rabbitmq import QueueSink, amqp_name

            name = amqp_name("bench", run_id, database)
            sink = QueueSink(rabbitmq_url(stack), name, name)
            env |= {"RELAY_BROKER": "rabbitmq", "RELAY_RABBITMQ_URL": sink.url, "RELAY_RABBITMQ_EXCHANGE": sink.exchange}

        @contextmanager
        def start() -> Iterator[Running]:
            leases = client[database]["outbox_relay_leases"]
            with RelayChild(env, code) as relay:
                # With start_at=now and no checkpoint the relay stores its opening token at once:
                # once it is there the stream is open and every later insert will be published.
                wait_for("relay stream open", lambda: lease_token_data(leases, f"{database}.outbox")[0], 120,
                         relay.check_alive)
                yield Running(relay.check_alive, relay.pid, relay.buckets)

        name = label or ("relay, exactly-once" if delivery == "exactly-once" else "relay")
        if broker == "nats" and label is None:
            name = NATS_RELAY + (", exactly-once" if delivery == "exactly-once" else "")
        if broker == "rabbitmq" and label is None:
            name = RABBITMQ_RELAY
        return Contender(name, topic_template.format(aggregateType=AGGREGATE_TYPE), start, relay_event_id, live=True,
                         sink=sink)
    return make


def peer_maker(stack: LocalStack, client: MongoClient[Any], run_id: str, which: str, jars: Any) -> Maker:
    """A Kafka Connect peer ("mongo" or "debezium", at its defaults; "-tuned": tuned by its
    documentation), its change stream starting at the current cluster time."""
    from bench.peers import debezium_outbox_connector, mongodb_source_connector
    from bench.peers.connect import StandaloneWorker, tuned

    def make(database: str) -> Contender:
        now = client.admin.command("ping")["operationTime"]
        prefix = f"bench.{run_id}.{database}"
        if which.startswith("mongo"):
            spec = mongodb_source_connector(stack.mongo.uri, database, "outbox", now, f"{prefix}.mongo")
        else:
            spec = debezium_outbox_connector(stack.mongo.uri, database, "outbox", now, f"{prefix}.debezium",
                                             AGGREGATE_TYPE)
        spec = tuned(spec) if which.endswith("-tuned") else spec

        @contextmanager
        def start() -> Iterator[Running]:
            worker = StandaloneWorker(jars, spec, stack.kafka.bootstrap_servers)
            with worker:
                worker.start()
                yield Running(worker.check_alive, worker.pid)

        return Contender(spec.label.removeprefix("peer: "), spec.topic, start, peer_event_id, live=True)
    return make


NATS_RELAY = "relay to NATS"
RABBITMQ_RELAY = "relay to RabbitMQ"


def contenders(stack: LocalStack, client: MongoClient[Any], run_id: str, peers: Any,
               exactly_once: bool, nats: bool = False, rabbitmq: bool = False) -> list[tuple[str, Maker]]:
    """(key, maker) of the relay, its exactly-once mode, with `nats` the relay to NATS JetStream
    (issue 51: beside the relay on Kafka, same rounds), with `rabbitmq` the relay to RabbitMQ
    (issue 53, likewise), and (with `peers`, the resolved Kafka
    Connect jars) each peer at its defaults and tuned by its documentation (for throughput: a
    linger of 100 ms, larger polls; at a low rate the defaults may be faster)."""
    out = [("relay", relay_maker(stack, client, run_id))]
    if exactly_once:
        out.append(("relay-eos", relay_maker(stack, client, run_id, "exactly-once")))
    if nats:
        out.append(("relay-nats", relay_maker(stack, client, run_id, broker="nats")))
    if rabbitmq:
        out.append(("relay-rabbitmq", relay_maker(stack, client, run_id, broker="rabbitmq")))
    if peers is not None:
        out += [(w, peer_maker(stack, client, run_id, w, peers))
                for w in ("mongo", "mongo-tuned", "debezium", "debezium-tuned")]
    return out


def writer_reach(stack: LocalStack, client: MongoClient[Any], factory: EventFactory, payload_bytes: int,
                 steps: list[Step], seconds: float = 5.0) -> list[tuple[Step, float, float]]:
    """The writer alone at each step (no contender, nothing else running): (step, events/s it
    reached, its commit round trip p99 in ms). Says which rates this machine can write at all."""
    from bench.common import percentile
    from bench.writer import receive, writer_child
    from relay.outbox import Outbox

    out = []
    for step in steps:
        database = f"bench_writer_{int(step.rate)}x{step.batch}"
        Outbox(client[database]["outbox"]).init()
        wait_idle(stack)
        with writer_child(stack.mongo.uri, database, step.rate, seconds, payload_bytes, step.batch) as conn:
            receive(conn, 60, "ready")
            conn.send("go")
            result = receive(conn, seconds * 3 + 120, "result")
        round_trips = sorted(t * 1000 for t in result["round_trips"])
        out.append((step, len(result["committed"]) / result["seconds"], percentile(round_trips, 99)))
        progress(f"writer alone at {step.label}: {out[-1][1]:,.0f} events/s")
        client.drop_database(database)
    return out


def format_reach(reach: list[tuple[Step, float, float]]) -> list[str]:
    if not reach:
        return []
    lines = ["the writer alone (no contender running): can this machine write at each step's rate?"]
    lines += [f"  {step.label:<45} reached {got:>8,.0f} events/s ({got / step.rate:.0%}), commit p99 {p99:.1f} ms"
              + ("" if got >= 0.95 * step.rate else "  MISSED: the step measures a saturated machine")
              for step, got, p99 in reach]
    return lines


def latency_rounds(stack: LocalStack, client: MongoClient[Any], factory: EventFactory, payload_bytes: int,
                   steps: list[Step], seconds: float, rounds: int, entrants: list[tuple[str, Maker]],
                   run_id: str) -> list[tuple[Step, Latency]]:
    """Every step, `rounds` rounds each, every contender once per round in a rotated order (see the
    module docstring). A contender that fails gets a result with its error; the rounds go on."""
    out: list[tuple[Step, Latency]] = []
    for s, step in enumerate(steps):
        for r in range(rounds):
            shift = (s + r) % len(entrants)
            for key, make in entrants[shift:] + entrants[:shift]:
                database = f"bench_{run_id}_s{s}r{r}_{key.replace('-', '_')}"
                contender = make(database)
                progress(f"steady state [{step.label}, round {r + 1}/{rounds}]: {contender.label}")
                x = _one_round(stack, client, factory, payload_bytes, step, seconds, database, contender)
                x.round = r
                out.append((step, x))
                client.drop_database(database)
    return out


def _one_round(stack: LocalStack, client: MongoClient[Any], factory: EventFactory, payload_bytes: int, step: Step,
               seconds: float, database: str, contender: Contender) -> Latency:
    idle = wait_idle(stack)
    try:
        x = steady_state(stack, client, factory, payload_bytes, step.rate, seconds, step.batch, database, contender)
    except (TimeoutError, RuntimeError, OSError, KafkaException) as exc:
        log.error("steady state: %s failed: %s", contender.label, exc)
        x = failed(contender.label, step.rate, step.batch, f"{type(exc).__name__}: {exc}")
    x.idle_cores_before = idle
    progress(f"  p50/p99 {x.p50_ms:.1f} / {x.p99_ms:.1f} ms, own {x.own_p50_ms:.1f} / {x.own_p99_ms:.1f} ms, "
             f"writer {x.achieved_rate:,.0f}/s" + (f" FAILED {x.error}" if x.error else ""))
    return x


def _range(s: Summary, attr: str, spec: str = ".1f") -> str:
    low, high = s.span(attr)
    if math.isnan(low):
        return "-"
    return f"{s.median(attr):{spec}} ({low:{spec}}-{high:{spec}})"


def format_steady(summaries: list[Summary], rounds: int) -> list[str]:
    """Per step: each contender's medians (ranges) over the rounds its writer kept the rate."""
    lines: list[str] = []
    for step in dict.fromkeys(s.step for s in summaries):
        lines += [*([""] if lines else []),
                  f"steady state, {step.label}: {rounds} round(s), rotated order, servers idle first; medians "
                  "(ranges) of the rounds whose writer reached the target",
                  f"{'contender':<40} {'reached/s':>9} {'rounds':>6} {'p50 ms':>18} {'p99 ms':>20} "
                  f"{'own p50 ms':>16} {'own p99 ms':>18} {'read_committed p50/p99':>22} {'CPU µs/ev':>9} "
                  f"{'mongod':>6} {'RSS MB':>6}"]
        lines += [_summary_line(s) for s in summaries if s.step == step]
    if lines:
        lines.append("  latency = the commit's oplog wall time to the broker's append (LogAppendTime); own = the "
                     "relay's own share (relay_read_to_ack_seconds, read -> Kafka's ack or the transaction's commit); "
                     "read_committed = when a live read_committed consumer first had the event; rounds = rounds "
                     "counted / run (a round whose writer fell more than 5% short of the target is left out: "
                     "it measured a saturated machine); CPU and RSS of the contender's own process")
        if any(s.contender.startswith(NATS_RELAY) for s in summaries):
            lines.append(f"  {NATS_RELAY}: latency to the message's stored time in its JetStream stream (the server's "
                         "clock, as LogAppendTime); own = read -> JetStream's PubAck; read_committed = a live ordered "
                         "push consumer of the stream")
        if any(s.contender.startswith(RABBITMQ_RELAY) for s in summaries):
            lines.append(f"  {RABBITMQ_RELAY}: latency to when a live consumer of its quorum queue (in the harness, "
                         "auto-ack) received the message (RabbitMQ 3.10 stamps no stored time); read_committed = the "
                         "same consumer; own = read -> RabbitMQ's publisher confirm")
    return lines


def _summary_line(s: Summary) -> str:
    reached = statistics.median([x.achieved_rate for x in s.rounds if not x.error] or [math.nan])
    visible = f"{s.median('visible_p50_ms'):.1f} / {s.median('visible_p99_ms'):.1f}"
    return (f"{s.contender:<40} {reached:>9,.0f} {len(s.counted):>3}/{len(s.rounds):<2} "
            f"{_range(s, 'p50_ms'):>18} {_range(s, 'p99_ms'):>20} {_range(s, 'own_p50_ms'):>16} "
            f"{_range(s, 'own_p99_ms'):>18} {visible:>22} {s.median('cpu_us_per_event'):>9.0f} "
            f"{s.median('mongod_cpu_us_per_event'):>6.0f} {s.median('peak_rss_mb'):>6.0f}")


def format_rounds(results: list[tuple[Step, Latency]]) -> list[str]:
    """Every round of every step, as measured (the rounds the medians leave out marked)."""
    if not results:
        return []
    lines = ["steady-state rounds, as measured",
             f"{'step':<14} {'contender':<40} {'rnd':>3} {'reached':>7} {'p50':>7} {'p99':>7} {'max':>7} "
             f"{'own p50/p99':>13} {'commit p99':>10} {'behind p99/max ms':>17} {'CPU µs/ev':>9} {'mongod':>6} "
             f"{'idle':>5} {'other':>5}  note"]
    for step, x in results:
        name = f"{step.rate:,.0f}x{step.batch}"
        if x.error:
            lines.append(f"{name:<14} {x.contender:<40} {x.round + 1:>3} FAILED: {x.error.splitlines()[0][:300]}")
            continue
        note = "" if x.reached else "WRITER MISSED the target: left out"
        note += f" MISSING {x.missing}" if x.missing else ""
        note += f" dup {x.duplicates}" if x.duplicates else ""
        lines.append(f"{name:<14} {x.contender:<40} {x.round + 1:>3} {x.achieved_rate:>7,.0f} {x.p50_ms:>7.1f} "
                     f"{x.p99_ms:>7.1f} {x.max_ms:>7.1f} {x.own_p50_ms:>6.1f}/{x.own_p99_ms:<6.1f} "
                     f"{x.insert_p99_ms:>10.1f} {x.writer_p99_behind_ms:>8.0f}/{x.writer_max_behind_ms:<8.0f} "
                     f"{x.cpu_us_per_event:>9.0f} {x.mongod_cpu_us_per_event:>6.0f} "
                     f"{x.idle_cores_before:>5.2f} {x.other_cores:>5.2f}  {note}")
    lines.append("  ms from the oplog wall time; commit p99 = the writer's commit round trip; behind = how late the "
                 "writer started its writes; CPU = the contender's process per event, mongod = mongod's; idle = mongod + broker cores just before the round; other = cores other "
                 "processes took meanwhile")
    return lines

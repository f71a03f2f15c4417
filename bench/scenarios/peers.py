"""Peers on the same backlog and broker: two Kafka Connect connectors (JVM) and Conduit (Go).

Each peer runs alone, after the relay and the baselines, in its own process started for it
and stopped by its pid. The output topic is created first (PARTITIONS partitions); then the
process is launched and the sum of the topic's high watermarks is polled every POLL_S until
it reaches N. Measured:
- events/s by the rule every contestant is timed by (bench.scenarios.drain): from the first
  message's append time in the topic to the last one's; start-up (launch to first message)
  apart;
- the connector's start (for Kafka Connect the worker's log line "Creating connector <name>"),
  the rate from it (start-up of the connector included, not its JVM's) and from the launch;
- the process tree's CPU and peak RSS (sampled, `bench.sampling`) and mongod's CPU, from the
  launch until all N are in Kafka, then the messages in the topic just before it is stopped
  (more than N would be duplicates).
A peer that fails or times out gets a row with its error instead of figures; the run goes on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import confluent_kafka
import psutil

from bench.common import (
    AGGREGATE_TYPE,
    RESULTS_DIR,
    Row,
    consumer,
    create_topic,
    first_message,
    in_kafka,
    log,
    rate,
    wait_for,
)
from bench.peers.connect import ConnectorSpec, PeerError, PeerJars, StandaloneWorker
from bench.sampling import Sampler, stack_roles
from bench.scenarios.backlog import Backlog
from bench.scenarios.drain import rate_of, topic_span
from relay.dev.stack import LocalStack


class PeerProcess(Protocol):
    """What `peer_catch_up` needs of a running peer (StandaloneWorker, ConduitPeer)."""

    @property
    def pid(self) -> int | None: ...

    def start(self) -> None: ...

    def check_alive(self) -> None: ...

    def connector_started_at(self) -> float | None: ...


@dataclass(frozen=True)
class Peer:
    """One peer of a run: its row label, output topic, message format, and how to launch it."""

    key: str
    label: str
    topic: str
    output: str                                                    # what a message is, in words
    launch: Callable[[], AbstractContextManager[PeerProcess]] | None   # None: could not be built
    error: str | None = None                                       # why it could not be built


def connect_peer(spec: ConnectorSpec, jars: PeerJars | None, jars_error: str | None, bootstrap: str) -> Peer:
    """A Kafka Connect peer (`bench.peers.connect`), or its failure to resolve its jars."""
    if jars is None:
        return Peer(spec.key, spec.label, spec.topic, spec.output, None, jars_error or "jars not resolved")
    return Peer(spec.key, spec.label, spec.topic, spec.output,
                lambda: StandaloneWorker(jars, spec, bootstrap, keep_log=RESULTS_DIR / f"connect-{spec.key}.log"))


def connect_specs(stack: LocalStack, backlog: Backlog, run_id: str) -> list[ConnectorSpec]:
    """The two Kafka Connect peers, starting their change stream at `backlog.before` (the
    cluster time just before the first backlog insert; the relay starts at that time's second)."""
    from bench.peers import debezium_outbox_connector, mongodb_source_connector

    uri = stack.mongo.uri
    return [
        debezium_outbox_connector(uri, backlog.database, backlog.collection, backlog.before,
                                  f"bench.{run_id}.debezium", AGGREGATE_TYPE),
        mongodb_source_connector(uri, backlog.database, backlog.collection, backlog.before,
                                 f"bench.{run_id}.mongo"),
    ]


def conduit_peer(stack: LocalStack, backlog: Backlog, run_id: str, binaries: Any, error: str | None) -> Peer:
    """The Conduit peer (`bench.peers.conduit`), or its build failure."""
    from bench.peers.conduit import ConduitPeer

    topic = f"bench.{run_id}.conduit"
    label = "peer: Conduit + MongoDB connector"
    output = "OpenCDC JSON record (Conduit's default format); key _id; snapshot read of the collection"
    if binaries is None:
        return Peer("conduit", label, topic, output, None, error or "not built")
    return Peer("conduit", label, topic, output,
                lambda: ConduitPeer(binaries, stack.mongo.uri, backlog.database, backlog.collection,
                                    stack.kafka.bootstrap_servers, topic, keep_log=RESULTS_DIR / "conduit.log"))


def failed_row(peer: Peer, backlog: Backlog, error: str) -> Row:
    return Row(peer.label, backlog.events, math.nan, math.nan, variant=backlog.variant.key, kind="peer",
               error=error, note=f"FAILED: {error.splitlines()[0][:160]}", extra={"key": peer.key,
                                                                                    "output": peer.output})


def _tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children so far."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        return sum(t.user + t.system for t in (p.cpu_times() for p in procs))
    except psutil.Error:
        return 0.0


def peer_catch_up(stack: LocalStack, backlog: Backlog, peer: Peer) -> Row:
    """The peer drains the backlog into its topic (see the module docstring)."""
    if peer.launch is None:
        return failed_row(peer, backlog, peer.error or "not available")
    bootstrap = stack.kafka.bootstrap_servers
    try:
        create_topic(bootstrap, peer.topic)
        with consumer(bootstrap) as c, peer.launch() as process:
            first: list[float] = []
            cpu_at_start: list[float] = []  # the peer's CPU when its connector started (JVM start-up)

            def all_in_kafka() -> bool:
                if not cpu_at_start and process.pid is not None and process.connector_started_at() is not None:
                    cpu_at_start.append(_tree_cpu_s(process.pid))
                count = in_kafka(c, peer.topic)
                if count > 0 and not first:
                    first.append(time.time())
                return count >= backlog.events

            roles = stack_roles(stack, lambda: {"peer": process.pid})
            with Sampler(roles, trees=frozenset({"peer"})) as sampler:
                launched = time.time()
                process.start()
                wait_for(f"{peer.label} catch-up", all_in_kafka, max(180.0, backlog.events / 200),
                         process.check_alive)
                ended = time.time()
            usage = sampler.stop()
            started = process.connector_started_at()
            time.sleep(1.0)  # anything still in flight (duplicates) lands before the final count
            final = in_kafka(c, peer.topic)
        if started is None and peer.key != "conduit":
            raise PeerError(f"no 'Creating connector' line in the {peer.label} worker's log")
        started = launched if started is None else started
        span = topic_span(bootstrap, peer.topic, launched)  # the rule every contestant is timed by
        seconds = span.drain_s
        value = first_message(bootstrap, peer.topic).value() or b""
        note = (f"first to last message; start-up {span.start_up_s:.1f} s apart (JVM {started - launched:.1f} s)"
                if started > launched else f"first to last message; start-up {span.start_up_s:.1f} s apart")
        if final != backlog.events:
            note += f"; {final} messages in topic"
        # CPU over the interval the rate covers: from the connector's start, without the JVM's.
        peer_cpu = usage.cpu_s.get("peer", math.nan) - (cpu_at_start[0] if cpu_at_start else 0.0)
        note += f"; CPU from connector start (JVM start-up {cpu_at_start[0]:.1f} s CPU excluded)" if cpu_at_start else ""
        return Row(peer.label, backlog.events, seconds, rate_of(backlog.events, span), variant=backlog.variant.key,
                   kind="peer", cpu_us_per_event=peer_cpu / backlog.events * 1e6,
                   mongod_cpu_us_per_event=usage.cpu_us_per_event("mongod", backlog.events),
                   peak_rss_mb=usage.peak_rss_mb.get("peer", math.nan), other_cores=usage.other_cores,
                   iowait_cores=usage.iowait_cores, note=note,
                   extra={"key": peer.key, "output": peer.output, "topic": peer.topic, "start_up_s": span.start_up_s,
                          "worker_start_s": started - launched, "first_message_s": first[0] - started,
                          "all_in_seconds": ended - launched,
                          "all_in_events_per_s": rate(backlog.events, ended - launched),
                          "drain_events_per_s": rate_of(backlog.events, span),
                          "from_connector_start_events_per_s": rate(backlog.events, ended - started),
                          "cpu_s": usage.cpu_s.get("peer", math.nan), "in_kafka_final": final,
                          "value_bytes": len(value), "sample_value": value[:400].decode(errors="replace")})
    except (PeerError, TimeoutError, RuntimeError, OSError, confluent_kafka.KafkaException) as exc:
        log.error("%s failed: %s", peer.label, exc)
        return failed_row(peer, backlog, f"{type(exc).__name__}: {exc}")

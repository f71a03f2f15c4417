"""The relay benchmark (`make bench`): catch-up and latency on equal terms, payloads, memory, goals.

One fresh local stack (a mongod replica-set member and a Kafka broker in a temporary folder, topics
of 3 partitions; bench/stack.py), then, in order: the catch-up on equal terms (scenarios/fair.py:
every contestant its own process, backlogs sized for `--drain-seconds` of draining, timed from the
first delivered event to the last) and, the same way, each payload variant's relay and bare relay
(`--only-equal-terms` stops there); single samples of every variant on one shared backlog
with the 1,000,000-event memory run (`variant_scenarios`); Conduit when it builds; latency on equal
terms (scenarios/steady.py); optionally the partitioned outbox; many outboxes through one stream
(scenarios/outboxes.py, unless `--no-outboxes`); the inbox; then the tables and the goals
(report.py). `--help` lists the options; BENCHMARKS.md says what each figure means.

NATS JetStream (issue 51, unless `--no-nats`): a nats-server in the same stack, the relay to NATS
in both modes beside a bare relay to NATS and the relay to Kafka on equal terms (after the Kafka
catch-up's field and its payloads), and the relay to NATS in the latency steps beside the relay on
Kafka. `--only-nats` runs just that part: the NATS field, then the latency steps (500 and 1000x10
unless `--rates` says otherwise) for the relay on Kafka and on NATS, then the tables and goals.

RabbitMQ (issue 53, unless `--no-rabbitmq`) the same way: a rabbitmq-server in the same stack, the
relay to RabbitMQ beside a bare relay to RabbitMQ and the relay to Kafka on equal terms (after the
NATS field), and the relay to RabbitMQ in the latency steps beside the relay on Kafka and on NATS.
`--only-rabbitmq` runs just that part: the RabbitMQ field, then the latency steps (500 and 1000x10
unless `--rates` says otherwise) for the relay on Kafka, on NATS (unless `--no-nats`) and on RabbitMQ.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import pymongo
from pymongo import MongoClient

from bench.common import first_message, log, progress
from bench.events import Variant, variants
from bench.relay_under_test import relay_settings
from bench.report import Report, format_report, update_benchmarks_md, write_json
from bench.scenarios import outboxes
from bench.scenarios.backlog import Backlog, write_backlog
from bench.scenarios.bare_relay import bare_relay
from bench.scenarios.catch_up import relay_catch_up
from bench.scenarios.change_stream import bare_change_stream
from bench.scenarios.exactly_once import exactly_once_catch_up
from bench.scenarios.fair import (
    contestants,
    fair_catch_up,
    nats_contestants,
    nats_field,
    rabbitmq_contestants,
    rabbitmq_field,
    relay_and_bare,
)
from bench.scenarios.inbox import inbox_scenario
from bench.scenarios.memory import memory_run
from bench.scenarios.outbox_writer import writer_overhead
from bench.scenarios.partitions import group_catch_up, stream_cost
from bench.scenarios.peers import conduit_peer, peer_catch_up
from bench.scenarios.producer import bare_producer
from bench.scenarios.steady import contenders, latency_rounds, parse_steps, writer_reach
from bench.stack import bench_stack
from relay.dev.stack import LocalStack

NATS_RATES = "500,1000x10"  # --only-nats, --only-rabbitmq: the steps of issues 51 and 53 (full run: --rates)
RATES = "500,1000x10,5000x50"
GROUPS = [(1, 1), (4, 1), (4, 2), (4, 4)]  # (RELAY_PARTITIONS, relay processes) of the group catch-up
STREAMS = [1, 2, 4, 8]


def variant_scenarios(stack: LocalStack, client: MongoClient[Any], variant: Variant, run_id: str,
                      report: Report, long_events: int = 0, exactly_once: bool = False) -> Backlog:
    """Backlog, relay catch-up and the three bare baselines for one payload variant (with
    `long_events`, the long-backlog memory run before the bare producer; with `exactly_once`,
    the catch-up in exactly-once mode right after the at-least-once one, on the same backlog)."""
    progress(f"[{variant.label}] writing a backlog of {variant.events} events")
    backlog = write_backlog(client, f"bench_{run_id}_{variant.key}", variant)
    progress(f"[{variant.label}] relay catch-up")
    relay = relay_catch_up(stack, client, backlog, run_id)
    transactional = [exactly_once_catch_up(stack, client, backlog, run_id)] if exactly_once else []
    sample = first_message(stack.kafka.bootstrap_servers, relay.extra["topic"])
    relay.extra["value_bytes"] = len(sample.value() or b"")
    relay.extra["message_headers"] = len(sample.headers() or [])
    settings = relay_settings(stack, backlog.database, "unused", "now")
    progress(f"[{variant.label}] baselines: bare relay, bare change stream")
    bare = bare_relay(stack, client, backlog, settings, f"bench.{run_id}.bare-relay-{variant.key}")
    stream = bare_change_stream(stack, client, backlog)
    if long_events:
        # Before the bare producer, whose queue of 100,000 messages leaves this process's RSS
        # larger; after the other baselines, so that mongod is not still writing the long backlog out.
        progress(f"memory: relay catch-up through a backlog of {long_events:,} events")
        report.long_run = list(memory_run(stack, client, variant, long_events, run_id))
    progress(f"[{variant.label}] baseline: bare producer")
    producer = bare_producer(stack, settings, sample, variant.events, f"bench.{run_id}.producer-{variant.key}",
                             variant.key)
    report.rows += [backlog.row, relay, *transactional, bare, stream, producer]
    return backlog


def partition_scenarios(stack: LocalStack, client: MongoClient[Any], events: int, run_id: str,
                        report: Report) -> None:
    """One backlog; the group catch-ups (GROUPS) and the change stream cost (STREAMS) on it."""
    variant = Variant("partitions", "200 B generic", 200, False, events)
    progress(f"[partitions] writing a backlog of {events} events")
    backlog = write_backlog(client, f"bench_{run_id}_partitions", variant)
    report.partition_rows.append(backlog.row)
    for partitions, processes in GROUPS:
        progress(f"[partitions] catch-up: {processes} relay process(es), RELAY_PARTITIONS={partitions}")
        report.partition_rows.append(group_catch_up(stack, client, backlog, run_id, partitions, processes))
    for streams in STREAMS:
        progress(f"[partitions] mongod with {streams} change stream(s)")
        report.partition_rows.append(stream_cost(stack, client, backlog, streams))


def prepare_peers(args: argparse.Namespace, report: Report) -> dict[str, Any]:
    """Resolve the Connect peers' jars and build Conduit before the stack starts (never timed)."""
    from bench.peers import DEBEZIUM_VERSION, KAFKA_CONNECT_VERSION, MONGO_KAFKA_VERSION, conduit, fetch_jars
    from bench.peers.process import PeerError

    prepared: dict[str, Any] = {"jars": None, "jars_error": None, "conduit": None, "conduit_error": None}
    versions = {"kafka_connect": KAFKA_CONNECT_VERSION, "debezium": DEBEZIUM_VERSION,
                "mongo_kafka_connect": MONGO_KAFKA_VERSION, "java": java_version(),
                "conduit": f"{conduit.CONDUIT_VERSION} + mongo connector {conduit.MONGO_CONNECTOR_VERSION}"}
    report.params["peers"] = versions
    progress("resolving the Kafka Connect peers' jars (Maven, first run only)")
    try:
        prepared["jars"] = fetch_jars()
    except PeerError as exc:
        prepared["jars_error"] = str(exc)
        log.error("Kafka Connect peers skipped: %s", exc)
    if not args.conduit:
        prepared["conduit_error"] = "skipped (--no-conduit)"
        return prepared
    progress("building Conduit and its MongoDB connector (go install, first run only)")
    try:
        prepared["conduit"] = conduit.build()
        versions["conduit"] = conduit.built_versions(prepared["conduit"])
    except PeerError as exc:
        prepared["conduit_error"] = str(exc)
        log.error("Conduit peer skipped: %s", exc)
    return prepared


def equal_terms(stack: LocalStack, client: MongoClient[Any], args: argparse.Namespace, runs: list[Variant],
                prepared: dict[str, Any], report: Report) -> None:
    """The catch-up on equal terms: every contestant on the default payload, then the relay and its
    bare relay on each other payload variant (bench.scenarios.fair)."""
    field = contestants(stack, client, prepared.get("jars"), prepared.get("jars_error"), args.peers,
                        args.exactly_once)
    field = [c for c in field if not any(part in c.name for part in args.skip_contestants)]
    run_id = report.params["run_id"]
    first = fair_catch_up(stack, client, runs[0], run_id, args.rounds, field, args.drain_seconds, args.probe_events)
    report.fair, report.fair_runs[runs[0].key] = first.entrants, first
    for variant in runs[1:]:
        pair = fair_catch_up(stack, client, variant, run_id, args.rounds, relay_and_bare(stack, client),
                             args.drain_seconds, args.probe_events)
        report.variant_fair[variant.key], report.fair_runs[variant.key] = pair.entrants, pair


def nats_equal_terms(stack: LocalStack, client: MongoClient[Any], args: argparse.Namespace, variant: Variant,
                     report: Report) -> None:
    """The NATS JetStream field on equal terms (issue 51; bench.scenarios.fair.nats_contestants)."""
    field = nats_contestants(stack, client, args.exactly_once)
    field = [c for c in field if not any(part in c.name for part in args.skip_contestants)]
    report.nats_fair = fair_catch_up(stack, client, variant, report.params["run_id"], args.rounds,
                                     nats_field(field, args.drain_seconds), args.drain_seconds, args.probe_events)


def nats_scenarios(stack: LocalStack, client: MongoClient[Any], args: argparse.Namespace, variant: Variant,
                   report: Report) -> None:
    """`--only-nats`: the NATS field on equal terms, then (unless `--only-equal-terms`) the latency
    steps for the relay on Kafka and the relay to NATS, same rounds, same writer."""
    run_id = report.params["run_id"]
    if args.rounds:
        nats_equal_terms(stack, client, args, variant, report)
    if args.only_equal_terms:
        return
    entrants = contenders(stack, client, run_id, None, exactly_once=False, nats=True)
    report.writer_reach = writer_reach(stack, client, variant.factory(), args.payload_bytes, args.rates)
    report.latency = latency_rounds(stack, client, variant.factory(), args.payload_bytes, args.rates,
                                    args.seconds, args.latency_rounds, entrants, run_id)


def rabbitmq_equal_terms(stack: LocalStack, client: MongoClient[Any], args: argparse.Namespace, variant: Variant,
                         report: Report) -> None:
    """The RabbitMQ field on equal terms (issue 53; bench.scenarios.fair.rabbitmq_contestants)."""
    field = rabbitmq_contestants(stack, client)
    field = [c for c in field if not any(part in c.name for part in args.skip_contestants)]
    report.rabbitmq_fair = fair_catch_up(stack, client, variant, report.params["run_id"], args.rounds,
                                         rabbitmq_field(field, args.drain_seconds), args.drain_seconds,
                                         args.probe_events)


def rabbitmq_scenarios(stack: LocalStack, client: MongoClient[Any], args: argparse.Namespace, variant: Variant,
                       report: Report) -> None:
    """`--only-rabbitmq`: the RabbitMQ field on equal terms, then (unless `--only-equal-terms`) the
    latency steps for the relay on Kafka, to NATS (unless `--no-nats`) and to RabbitMQ, same rounds,
    same writer."""
    run_id = report.params["run_id"]
    if args.rounds:
        rabbitmq_equal_terms(stack, client, args, variant, report)
    if args.only_equal_terms:
        return
    entrants = contenders(stack, client, run_id, None, exactly_once=False, nats=args.nats, rabbitmq=True)
    report.writer_reach = writer_reach(stack, client, variant.factory(), args.payload_bytes, args.rates)
    report.latency = latency_rounds(stack, client, variant.factory(), args.payload_bytes, args.rates,
                                    args.seconds, args.latency_rounds, entrants, run_id)


def scenarios(stack: LocalStack, client: MongoClient[Any], args: argparse.Namespace, prepared: dict[str, Any],
              report: Report) -> None:
    """Every scenario the arguments ask for, in the order of the module docstring."""
    run_id = report.params["run_id"]
    if args.only_partitions:
        partition_scenarios(stack, client, args.partition_events, run_id, report)
        return
    if not args.only_inbox:
        runs = variants(args.events, args.payload_bytes, sizes=args.variants, typed=args.variants)
        runs = runs[:1] + [v for v in runs[1:] if v.key in args.variant_keys]
        report.variants = {v.key: v.label for v in runs}
        if args.only_nats:
            report.variants = {runs[0].key: runs[0].label}
            nats_scenarios(stack, client, args, runs[0], report)
            return
        if args.only_rabbitmq:
            report.variants = {runs[0].key: runs[0].label}
            rabbitmq_scenarios(stack, client, args, runs[0], report)
            return
        if args.rounds:
            equal_terms(stack, client, args, runs, prepared, report)
            if args.nats:
                nats_equal_terms(stack, client, args, runs[0], report)
            if args.rabbitmq:
                rabbitmq_equal_terms(stack, client, args, runs[0], report)
        if args.only_equal_terms:
            return
        default = variant_scenarios(stack, client, runs[0], run_id, report, args.long_events, args.exactly_once)
        for variant in runs[1:]:
            variant_scenarios(stack, client, variant, run_id, report)
        if args.peers and args.conduit:
            progress("peer: Conduit")
            report.rows.append(peer_catch_up(stack, default, conduit_peer(stack, default, run_id, prepared["conduit"],
                                                                          prepared["conduit_error"])))
        entrants = contenders(stack, client, run_id, prepared.get("jars") if args.peers else None, args.exactly_once,
                              nats=args.nats, rabbitmq=args.rabbitmq)
        report.writer_reach = writer_reach(stack, client, runs[0].factory(), args.payload_bytes, args.rates)
        report.latency = latency_rounds(stack, client, runs[0].factory(), args.payload_bytes, args.rates,
                                        args.seconds, args.latency_rounds, entrants, run_id)
        if args.partitions:
            partition_scenarios(stack, client, args.partition_events, run_id, report)
        if args.outboxes_options:  # scenarios/outboxes.py: sidecars beside one shared relay
            report.outboxes = outboxes.outboxes_scenario(stack, client, args.outboxes_options, run_id)
    if args.inbox:
        report.inbox = inbox_scenario(stack.mongo.uri, stack.kafka.bootstrap_servers, args.inbox_events,
                                      rounds=args.inbox_rounds)
        report.inbox["writer"] = writer_overhead(stack.mongo.uri)


def run(args: argparse.Namespace) -> Report:
    """Start the stack, run every scenario, stop and delete the stack; return the results."""
    started = time.monotonic()
    report = Report(params=parameters(args))
    alone = args.only_partitions or args.only_inbox
    peers_needed = args.peers and not (alone or args.only_nats or args.only_rabbitmq)
    prepared = prepare_peers(args, report) if peers_needed else {}
    nats, rabbitmq = brokers(args)
    try:
        with bench_stack(nats=nats, rabbitmq=rabbitmq) as (stack, client):
            scenarios(stack, client, args, prepared, report)
    finally:
        report.params["load_average_at_end"] = os.getloadavg()
        report.params["wall_seconds"] = time.monotonic() - started
    return report


def brokers(args: argparse.Namespace) -> tuple[bool, bool]:
    """Whether the run needs a nats-server and a rabbitmq-server beside Kafka."""
    alone = args.only_partitions or args.only_inbox
    nats = args.nats and not (alone or (args.only_rabbitmq and args.only_equal_terms))
    return nats, args.rabbitmq and not (alone or args.only_nats)


def parameters(args: argparse.Namespace) -> dict[str, Any]:
    """What the report says about the run: its arguments, the host, the relay's code."""
    return {
        "events": args.events, "payload_bytes": args.payload_bytes, "seconds": args.seconds,
        "rates": [f"{s.rate:g}x{s.batch}" for s in args.rates], "latency_rounds": args.latency_rounds,
        "long_events": args.long_events, "run_id": uuid.uuid4().hex[:8], "variant_keys": args.variant_keys,
        "command": args.command, "rounds": args.rounds,
        "drain_seconds": args.drain_seconds, "probe_events": args.probe_events,
        "partition_events": args.partition_events if args.partitions or args.only_partitions else None,
        "inbox_events": args.inbox_events if args.inbox else None, "inbox_rounds": args.inbox_rounds,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nats": nats_versions() if brokers(args)[0] else None,
        "only_nats": args.only_nats,
        "rabbitmq": rabbitmq_versions() if brokers(args)[1] else None,
        "only_rabbitmq": args.only_rabbitmq,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "pymongo": pymongo.version, "confluent_kafka": confluent_kafka.__version__,
                 "librdkafka": confluent_kafka.libversion()[0]},
        "relay_source": relay_source(),
        "load_average_at_start": os.getloadavg(),
    }


def nats_versions() -> dict[str, str]:
    """The nats-server the stack runs (relay.dev.nats_server's pinned wheel) and the nats-py client."""
    from importlib.metadata import version

    from relay.dev.nats_server import VERSION

    return {"nats_server": VERSION, "nats_py": version("nats-py")}


def rabbitmq_versions() -> dict[str, str]:
    """The rabbitmq-server the stack runs (relay.dev.rabbitmq_server's pinned Debian packages) and pika."""
    from importlib.metadata import version

    from relay.dev.rabbitmq_server import VERSION

    return {"rabbitmq_server": VERSION, "pika": version("pika")}


def java_version() -> str:
    """`java -version`'s first line (the JVM the Kafka Connect peers run on)."""
    from bench.peers.connect import java_binary

    try:
        out = subprocess.run([java_binary(), "-version"], capture_output=True, text=True, timeout=30)
        return (out.stderr or out.stdout).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError, RuntimeError):
        return "unknown"


def relay_source() -> str:
    """Which relay code ran: the commit, and whether relay/ differs from it in the working tree."""
    import relay

    repo = Path(relay.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "relay"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{repo} (not a git checkout)"
    return f"{head}{' + uncommitted changes in relay/' if dirty else ''} ({repo})"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--events", type=int, default=100_000,
      help="backlog of the default variant (default 100000; 2 KB: half, 20 KB: a fifth)")
    a("--payload-bytes", type=int, default=200,
      help="BSON size of each event's payload document in the default variant (default 200)")
    a("--rates", default=None,
      help=f"steady-state steps, RATE[xBATCH] comma-separated: events/s and events per transaction "
           f"(default {RATES}, with --only-nats or --only-rabbitmq {NATS_RATES}; no xBATCH: one transaction per "
           "event)")
    a("--seconds", type=float, default=20.0, help="writes per steady-state round (default 20)")
    a("--latency-rounds", type=int, default=3, help="rounds of each steady-state step (default 3)")
    a("--long-events", type=int, default=1_000_000, help="backlog of the memory run (default 1000000; 0 skips it)")
    a("--no-peers", dest="peers", action="store_false", help="skip the peers (Debezium, MongoDB connector, Conduit)")
    a("--rounds", type=int, default=3,
      help="rounds of the catch-up on equal terms (bench/scenarios/fair.py; default 3, 0 skips it)")
    a("--drain-seconds", type=float, default=15.0,
      help="catch-up on equal terms: size each round's backlog so that every contestant drains for at least "
           "this long on this machine (default 15; a calibration measures the rates first)")
    a("--probe-events", type=int, default=50_000,
      help="catch-up on equal terms: the calibration's probe backlog (default 50000)")
    a("--only-equal-terms", action="store_true",
      help="run only the catch-up on equal terms (and its payload variants), then the tables and goals")
    a("--no-conduit", dest="conduit", action="store_false", help="skip the Conduit peer")
    a("--no-exactly-once", dest="exactly_once", action="store_false",
      help="skip the relay in exactly-once mode (RELAY_DELIVERY=exactly-once)")
    a("--no-variants", dest="variants", action="store_false", help="only the default payload (skip 2 KB, 20 KB, typed)")
    a("--variant-keys", default="2kb,20kb,typed",
      help="which payload variants besides the default (comma-separated of 2kb, 20kb, typed)")
    a("--skip-contestants", default="",
      help="catch-up contestants to leave out, comma-separated parts of their names (e.g. 'clean-up,change stream')")
    a("--partitions", action="store_true",
      help="also run the partitioned-outbox scenarios (RELAY_PARTITIONS; about 6 minutes)")
    a("--only-partitions", action="store_true", help="run only the partitioned-outbox scenarios")
    a("--partition-events", type=int, default=200_000, help="backlog of the partitioned-outbox scenarios")
    a("--no-inbox", dest="inbox", action="store_false",
      help="skip the inbox beside two bare consumers (bench/scenarios/inbox.py)")
    a("--only-inbox", action="store_true", help="run only the inbox's scenario")
    a("--no-nats", dest="nats", action="store_false",
      help="skip NATS JetStream (issue 51): no nats-server, no NATS field on equal terms, no relay to NATS in "
           "the latency steps")
    a("--only-nats", action="store_true",
      help="run only NATS JetStream (issue 51): the relay to NATS in both modes, the bare relay to NATS and the "
           f"relay to Kafka on equal terms, then latency at --rates (default {NATS_RATES}) for the relay on "
           "Kafka and on NATS; with --only-equal-terms only the first")
    a("--no-rabbitmq", dest="rabbitmq", action="store_false",
      help="skip RabbitMQ (issue 53): no rabbitmq-server, no RabbitMQ field on equal terms, no relay to RabbitMQ "
           "in the latency steps")
    a("--only-rabbitmq", action="store_true",
      help="run only RabbitMQ (issue 53): the relay to RabbitMQ, the bare relay to RabbitMQ and the relay to Kafka "
           f"on equal terms, then latency at --rates (default {NATS_RATES}) for the relay on Kafka, to NATS "
           "(unless --no-nats) and to RabbitMQ; with --only-equal-terms only the first")
    a("--inbox-events", type=int, default=20_000,
      help="events on the inbox scenario's topic (default 20000; the per-event consumer reads 3000)")
    a("--inbox-rounds", type=int, default=3, help="rounds of the inbox scenario, in a rotated order (default 3)")
    a("--update-benchmarks", action="store_true",
      help="also write this run into BENCHMARKS.md (the section between the bench-latest markers)")
    outboxes.add_arguments(p)  # --outboxes 1,5,20, --no-outboxes, --outboxes-events ...
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    args.outboxes_options = outboxes.options_from(p, args)
    args.variant_keys = [k.strip() for k in args.variant_keys.split(",") if k.strip()]
    args.skip_contestants = [k.strip() for k in args.skip_contestants.split(",") if k.strip()]
    try:
        args.rates = parse_steps(args.rates or (NATS_RATES if args.only_nats or args.only_rabbitmq else RATES))
    except ValueError as exc:
        p.error(f"--rates: {exc}")
    problems = [
        (args.partition_events < 1, "--partition-events must be at least 1"),
        (args.rounds < 0 or args.latency_rounds < 1, "--rounds must be 0 or more, --latency-rounds 1 or more"),
        (args.drain_seconds <= 0 or args.probe_events < 1000,
         "--drain-seconds must be above 0 and --probe-events at least 1000"),
        (args.inbox_events < 1 or args.inbox_rounds < 1, "--inbox-events and --inbox-rounds must be at least 1"),
        (args.only_inbox and (args.only_partitions or not args.inbox),
         "--only-inbox cannot go with --only-partitions or --no-inbox"),
        (args.only_nats and (args.only_partitions or args.only_inbox or not args.nats),
         "--only-nats cannot go with --only-partitions, --only-inbox or --no-nats"),
        (args.only_rabbitmq and (args.only_partitions or args.only_inbox or args.only_nats or not args.rabbitmq),
         "--only-rabbitmq cannot go with --only-partitions, --only-inbox, --only-nats or --no-rabbitmq"),
        (args.events < 1 or args.seconds <= 0 or args.payload_bytes < 32 or args.long_events < 0,
         "--events >= 1, --seconds > 0, --payload-bytes >= 32 and --long-events >= 0 are required"),
        (any(int(s.rate * args.seconds) < s.batch for s in args.rates),
         "every rate x --seconds must be at least one transaction"),
    ]
    for bad, message in problems:
        if bad:
            p.error(message)
    args.inbox = args.inbox or args.only_inbox
    args.command = shlex.join(["python", "-m", "bench.run", *(sys.argv[1:] if argv is None else argv)])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    report = run(args)
    text = format_report(report)
    print(text)
    print(f"\nresults: {write_json(report)}", file=sys.stderr)
    if args.update_benchmarks:
        print(f"updated: {update_benchmarks_md(report, text)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

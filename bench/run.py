"""The relay benchmark: catch-up beside a bare relay, bare clients and three peers; latency; memory.

Run: `.venv/bin/python -m bench.run [--events N] [--payload-bytes B] [--rates 1000,10000]
[--seconds S] [--long-events N] [--no-peers] [--no-variants] [--partitions | --only-partitions
[--partition-events N]] [--no-inbox | --only-inbox] [--inbox-events N] [--inbox-rounds R]
[--update-benchmarks]` (`make bench` runs it with the defaults, `make bench BENCH_ARGS=--only-inbox`
only the inbox's scenario; the partitioned-outbox scenarios, about 6 minutes, only with
`--partitions`). BENCHMARKS.md shows a run and says what each figure
means; `bench/scenarios/` has one module per scenario, each documenting what it measures.

Everything runs on a fresh local stack (`relay.dev.stack.LocalStack` in a temporary folder, one
mongod replica-set member and one Kafka broker, topics with 3 partitions), stopped by its own
`stop()` and deleted at the end. The relay runs in this process, in a thread
(`bench.relay_under_test`); the steady-state writer is a child process; each peer its own process.

Order: warm up Kafka; first the catch-up on equal terms (bench/scenarios/fair.py, `--rounds`,
default 3): the relay, the relay with clean-up by position on, the relay in exactly-once mode, the
bare relay, the bare change stream and each Kafka Connect peer at its defaults and tuned by its
documentation, each on a fresh backlog written just before it, once the servers are idle, in an
order rotated every round; its medians give the headline ratios and the goals; then, the same
way, the relay and its bare relay on each other payload variant (their goals are ratios of those
medians). Then, for each
payload variant (default first, then 2 KB, 20 KB, typed): write its backlog, relay catch-up (for
the default variant also in exactly-once mode, on the same backlog), bare relay, bare change
stream, bare producer (the long-backlog memory run comes before the default variant's bare
producer, whose queue leaves this process larger); then Conduit (unless `--no-conduit`); then
one steady-state step per rate, for the relay and each Kafka Connect peer tuned
(bench/scenarios/latency.py); with `--partitions`, last, the partitioned outbox
(bench/scenarios/partitions.py): a backlog of `--partition-events`, drained by one relay process
at N=1 and by 1, 2 and 4 processes at N=4, then 1, 2, 4 and 8 change streams on it; then (unless
`--no-outboxes`) many outboxes through one stream (bench/scenarios/outboxes.py: N sidecar relays
beside one shared relay, `--outboxes 1,5,20`, and one process leading 1, 2, 4 partitions); last (unless
`--no-inbox`) the inbox, sync and async, beside two bare consumers (bench/scenarios/inbox.py:
`--inbox-events` on one topic, `--inbox-rounds` rounds in a rotated order), then the async
writer's overhead (bench/scenarios/outbox_writer.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import pymongo
from pymongo import MongoClient

from bench.common import PARTITIONS, first_message, log, progress, warm_up_kafka
from bench.events import Variant, variants
from bench.relay_under_test import relay_settings
from bench.report import Report, format_report, update_benchmarks_md, write_json
from bench.scenarios import outboxes
from bench.scenarios.backlog import Backlog, write_backlog
from bench.scenarios.bare_relay import bare_relay
from bench.scenarios.catch_up import relay_catch_up
from bench.scenarios.change_stream import bare_change_stream
from bench.scenarios.exactly_once import exactly_once_catch_up
from bench.scenarios.fair import contestants, fair_catch_up, relay_and_bare
from bench.scenarios.inbox import inbox_scenario
from bench.scenarios.latency import steady_step
from bench.scenarios.memory import memory_run
from bench.scenarios.outbox_writer import writer_overhead
from bench.scenarios.partitions import group_catch_up, stream_cost
from bench.scenarios.peers import Peer, conduit_peer, peer_catch_up
from bench.scenarios.producer import bare_producer
from relay.dev.stack import LocalStack


def variant_scenarios(stack: LocalStack, client: MongoClient[Any], variant: Variant, run_id: str,
                      report: Report, long_events: int = 0, exactly_once: bool = False) -> Backlog:
    """Backlog, relay catch-up and the three bare baselines for one payload variant (with
    `long_events`, the long-backlog memory run before the bare producer; with `exactly_once`,
    the catch-up in exactly-once mode right after the at-least-once one, on the same backlog)."""
    progress(f"[{variant.label}] writing a backlog of {variant.events} events")
    backlog = write_backlog(client, f"bench_{run_id}_{variant.key}", variant)
    progress(f"[{variant.label}] relay catch-up")
    relay = relay_catch_up(stack, client, backlog, run_id)
    transactional = []
    if exactly_once:
        progress(f"[{variant.label}] relay catch-up, exactly-once")
        transactional.append(exactly_once_catch_up(stack, client, backlog, run_id))
    sample = first_message(stack.kafka.bootstrap_servers, relay.extra["topic"])
    relay.extra["value_bytes"] = len(sample.value() or b"")
    relay.extra["message_headers"] = len(sample.headers() or [])
    settings = relay_settings(stack, backlog.database, "unused", "now")
    progress(f"[{variant.label}] baseline: bare relay")
    bare = bare_relay(stack, client, backlog, settings, f"bench.{run_id}.bare-relay-{variant.key}")
    progress(f"[{variant.label}] baseline: bare change stream")
    stream = bare_change_stream(stack, client, backlog)
    if long_events:
        # Before the bare producer, whose queue of 100,000 messages leaves this process's RSS
        # larger: the RSS through the long backlog is then the relay's, not what a baseline left.
        # After the other baselines, so that mongod is not still writing the long backlog out.
        progress(f"memory: relay catch-up through a backlog of {long_events:,} events")
        report.long_run = list(memory_run(stack, client, variant, long_events, run_id))
    progress(f"[{variant.label}] baseline: bare producer")
    producer = bare_producer(stack, settings, sample, variant.events, f"bench.{run_id}.producer-{variant.key}",
                             variant.key)
    report.rows += [backlog.row, relay, *transactional, bare, stream, producer]
    return backlog


GROUPS = [(1, 1), (4, 1), (4, 2), (4, 4)]  # (RELAY_PARTITIONS, relay processes) of the group catch-up
STREAMS = [1, 2, 4, 8]


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
    from bench.peers.connect import PeerError

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


def run(args: argparse.Namespace) -> Report:
    """Start the stack, run every scenario, stop and delete the stack; return the results."""
    run_id = uuid.uuid4().hex[:8]
    started = time.monotonic()
    report = Report(params={
        "events": args.events, "payload_bytes": args.payload_bytes, "rates": args.rates, "seconds": args.seconds,
        "long_events": args.long_events, "run_id": run_id, "variant_keys": args.variant_keys, "command": args.command, "rounds": args.rounds,
        "partition_events": args.partition_events if args.partitions or args.only_partitions else None,
        "inbox_events": args.inbox_events if args.inbox else None, "inbox_rounds": args.inbox_rounds,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "pymongo": pymongo.version, "confluent_kafka": confluent_kafka.__version__,
                 "librdkafka": confluent_kafka.libversion()[0]},
        "relay_source": relay_source(),
        "load_average_at_start": os.getloadavg(),
    })
    only_partitions = args.only_partitions
    prepared = prepare_peers(args, report) if args.peers and not (only_partitions or args.only_inbox) else {}
    stack = LocalStack.in_temp_dir(partitions=PARTITIONS)
    progress(f"starting MongoDB and Kafka in {stack.base_dir}")
    try:
        stack.start()
        warm_up_kafka(stack.kafka.bootstrap_servers)
        with MongoClient(stack.mongo.uri, tz_aware=True) as client:
            if only_partitions:
                partition_scenarios(stack, client, args.partition_events, run_id, report)
                return report
            if args.only_inbox:
                report.inbox = inbox_scenario(stack.mongo.uri, stack.kafka.bootstrap_servers, args.inbox_events,
                                              rounds=args.inbox_rounds)
                report.inbox["writer"] = writer_overhead(stack.mongo.uri)
                return report
            runs = variants(args.events, args.payload_bytes, sizes=args.variants, typed=args.variants)
            runs = runs[:1] + [v for v in runs[1:] if v.key in args.variant_keys]
            report.variants = {v.key: v.label for v in runs}
            if args.rounds:
                field = contestants(stack, client, prepared.get("jars"), prepared.get("jars_error"), args.peers,
                                    args.exactly_once)
                field = [c for c in field if not any(part in c.name for part in args.skip_contestants)]
                report.fair = fair_catch_up(stack, client, runs[0], run_id, args.rounds, field)
                for variant in runs[1:]:  # each payload variant: the relay and its bare relay, the same way
                    report.variant_fair[variant.key] = fair_catch_up(stack, client, variant, run_id, args.rounds,
                                                                     relay_and_bare(stack, client))
            default = variant_scenarios(stack, client, runs[0], run_id, report, args.long_events,
                                        args.exactly_once)
            for variant in runs[1:]:
                variant_scenarios(stack, client, variant, run_id, report)
            if args.peers and args.conduit:
                peers: list[Peer] = [conduit_peer(stack, default, run_id, prepared["conduit"],
                                                  prepared["conduit_error"])]
                for peer in peers:
                    progress(peer.label)
                    report.rows.append(peer_catch_up(stack, default, peer))
            factory = runs[0].factory()
            steady_peers = prepared.get("jars") if args.peers else None
            for step, rate in enumerate(args.rates):
                batch = 1 if rate <= 2000 else max(1, round(rate / 100))
                report.latency += steady_step(stack, client, factory, args.payload_bytes, rate, args.seconds,
                                              batch, run_id, steady_peers, step, args.exactly_once)
            if args.partitions:
                partition_scenarios(stack, client, args.partition_events, run_id, report)
            if args.outboxes_options:  # bench/scenarios/outboxes.py: sidecars beside one shared relay
                report.outboxes = outboxes.outboxes_scenario(stack, client, args.outboxes_options, run_id)
            if args.inbox:
                report.inbox = inbox_scenario(stack.mongo.uri, stack.kafka.bootstrap_servers, args.inbox_events,
                                              rounds=args.inbox_rounds)
                report.inbox["writer"] = writer_overhead(stack.mongo.uri)
    finally:
        progress("stopping the stack")
        stack.stop()
        leftovers = [p.pid for p in [*stack.mongo.processes, stack.kafka.process] if p is not None and p.alive]
        if leftovers:
            log.error("stack processes still running after stop(): %s", leftovers)
        shutil.rmtree(stack.base_dir, ignore_errors=True)
        report.params["load_average_at_end"] = os.getloadavg()
        report.params["wall_seconds"] = time.monotonic() - started
    return report


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000,
                   help="backlog of the default variant (default 100000; 2 KB: half, 20 KB: a tenth)")
    p.add_argument("--payload-bytes", type=int, default=200,
                   help="BSON size of each event's payload document in the default variant (default 200)")
    p.add_argument("--rates", default="1000,10000",
                   help="steady-state steps, events per second, comma-separated (default 1000,10000)")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each steady-state step (default 20)")
    p.add_argument("--long-events", type=int, default=1_000_000,
                   help="backlog of the memory run (default 1000000; 0 skips it)")
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="skip the peers (Debezium, MongoDB connector, Conduit)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of the catch-up on equal terms (bench/scenarios/fair.py; default 3, 0 skips it)")
    p.add_argument("--no-conduit", dest="conduit", action="store_false", help="skip the Conduit peer")
    p.add_argument("--no-exactly-once", dest="exactly_once", action="store_false",
                   help="skip the catch-up in exactly-once mode (RELAY_DELIVERY=exactly-once)")
    p.add_argument("--no-variants", dest="variants", action="store_false",
                   help="only the default payload (skip 2 KB, 20 KB and typed)")
    p.add_argument("--variant-keys", default="2kb,20kb,typed",
                   help="which payload variants besides the default (comma-separated of 2kb, 20kb, typed)")
    p.add_argument("--skip-contestants", default="",
                   help="catch-up contestants to leave out, comma-separated parts of their names "
                        "(e.g. 'clean-up,change stream')")
    p.add_argument("--partitions", action="store_true",
                   help="also run the partitioned-outbox scenarios (RELAY_PARTITIONS; about 6 minutes)")
    p.add_argument("--only-partitions", action="store_true",
                   help="run only the partitioned-outbox scenarios")
    p.add_argument("--partition-events", type=int, default=200_000,
                   help="backlog of the partitioned-outbox scenarios (default 200000)")
    p.add_argument("--no-inbox", dest="inbox", action="store_false",
                   help="skip the inbox beside two bare consumers (bench/scenarios/inbox.py)")
    p.add_argument("--only-inbox", action="store_true", help="run only the inbox's scenario")
    p.add_argument("--inbox-events", type=int, default=20_000,
                   help="events on the inbox scenario's topic (default 20000; the per-event consumer reads 3000)")
    p.add_argument("--inbox-rounds", type=int, default=3,
                   help="rounds of the inbox scenario, in a rotated order (default 3)")
    outboxes.add_arguments(p)  # --outboxes 1,5,20, --no-outboxes, --outboxes-events ...
    p.add_argument("--update-benchmarks", action="store_true",
                   help="also write this run into BENCHMARKS.md (the section between the bench-latest markers)")
    args = p.parse_args(argv)
    args.outboxes_options = outboxes.options_from(p, args)
    args.variant_keys = [k.strip() for k in args.variant_keys.split(",") if k.strip()]
    args.skip_contestants = [k.strip() for k in args.skip_contestants.split(",") if k.strip()]
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        p.error(f"--rates: comma-separated numbers expected, got {args.rates!r}")
    if args.partition_events < 1:
        p.error("--partition-events must be at least 1")
    if args.rounds < 0:
        p.error("--rounds must be 0 or more")
    if args.inbox_events < 1 or args.inbox_rounds < 1:
        p.error("--inbox-events and --inbox-rounds must be at least 1")
    if args.only_inbox and (args.only_partitions or not args.inbox):
        p.error("--only-inbox cannot go with --only-partitions or --no-inbox")
    args.inbox = args.inbox or args.only_inbox
    if args.events < 1 or args.seconds <= 0 or args.payload_bytes < 32 or args.long_events < 0 \
            or any(r <= 0 for r in args.rates):
        p.error("--events >= 1, --seconds > 0, --payload-bytes >= 32, --long-events >= 0 and rates > 0 are required")
    if any(int(r * args.seconds) < 1 for r in args.rates):
        p.error("every rate x --seconds must be at least one event")
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

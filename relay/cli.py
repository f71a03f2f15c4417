"""`outbox-relay` (also `python -m relay`): parse, configure logging, call the command.

Exit codes: 0 done, 1 unexpected failure, 2 bad configuration or usage, 3 a server cannot
be reached, 4 data an operator must look at: the relay stopped on it (poison event, history
lost, invalidated stream, changed pipeline), `schemas check` found a breaking schema change,
`pipeline audit` found a missing event or an order violation, or `replay` found part of its range
removed by clean-up; 5 a server refused a request with an error the relay does not expect
(ServerRefusedError); 130 interrupted (`replay` saves its progress first). `--version` prints the
package's version (the newest entry of CHANGELOG.md, plus `+dev` for a build carrying the changes
listed under its [Unreleased]).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from relay import __version__
from relay import config as cfg
from relay.commands.replay_plan import REPLAY_HELP, REPLAY_USAGE
from relay.commands.replay_plan import add_arguments as add_replay
from relay.core.errors import EXIT_CONFIG, EXIT_FATAL, EXIT_UNREACHABLE
from relay.core.redact import emit
from relay.core.signals import Then, stopping_on_signals
from relay.ops.exits import run_command

log = logging.getLogger("relay")

DEV_BROKERS = ("kafka", "nats", "rabbitmq")  # relay.dev.stack.BROKERS (the dev tooling is imported only when used)

DESCRIPTION = (
    "Publish a MongoDB outbox collection to Kafka through its change stream: in commit order, "
    "Avro-encoded, at least once (or exactly once for read_committed consumers), one active "
    "replica per lease. Every setting is also a RELAY_<NAME> environment variable."
)


def _parser() -> argparse.ArgumentParser:
    settings = cfg.settings_parser()
    p = argparse.ArgumentParser(prog="outbox-relay", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"outbox-relay {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("run", parents=[settings], help="publish the outbox to the broker (RELAY_BROKER) until stopped")
    _add_outbox_choice(
        sub.add_parser("status", parents=[settings], help="print every lease, checkpoint and replica as JSON"),
        "show only this outbox (database.collection; default: every outbox)",
    )
    demo = sub.add_parser("demo", parents=[settings], help="local stack + demo service + relay + consumer, end to end")
    demo.add_argument("--events", type=int, default=None, help="stop after this many events arrive")
    demo.add_argument("--rate", type=float, default=200.0, help="events per second the demo service writes")
    _add_dev(sub.add_parser("dev", help="the local MongoDB replica set and a broker (Kafka, NATS or RabbitMQ)"))
    _add_outbox(sub.add_parser("outbox", parents=[settings], help="outbox collection tasks"))
    checkpoint = sub.add_parser("checkpoint", parents=[settings], help="checkpoint tasks")
    checkpoint.add_argument("action", choices=["reset"])
    checkpoint.add_argument(
        "--force", action="store_true", help="reset even while a leader holds the lease, fencing it out"
    )
    _add_outbox_choice(checkpoint, "the outbox whose checkpoint to reset (needed with several)")
    pipeline = sub.add_parser(
        "pipeline",
        help="Spark jobs over the topics: materialize, audit (spark extra)",
        description="materialize: the event table and the per-aggregate state view (Parquet, MongoDB); "
        "audit: did every outbox event of a time range reach Kafka, in order (docs/spark.md)",
    )
    pipeline.add_argument("job", choices=["materialize", "audit"])
    pipeline.add_argument(
        "job_args", nargs=argparse.REMAINDER, metavar="...", help="the job's options (`pipeline JOB --help`)"
    )
    _add_schemas(sub.add_parser("schemas", help="check the Avro schemas: parse, envelope rules, compatibility"))
    _add_tail(sub.add_parser("tail", parents=[settings], help="print a topic's messages, decoded, as JSON lines"))
    add_replay(sub.add_parser("replay", parents=[settings], help=REPLAY_HELP, usage=REPLAY_USAGE))
    _add_inbox(
        sub.add_parser(
            "inbox",
            parents=[settings],
            help="a consumer's inbox records: forget those of lost effects, so a replay applies them again",
            description="forget: delete a consumer group's inbox records selected by the replay's filters "
            "(docs/inbox.md, README's runbook 'a consumer lost its state')",
        )
    )
    _add_security(
        sub.add_parser("security", parents=[settings], help="least-privilege MongoDB role (docs/security.md)")
    )
    return p


def _add_dev(dev: argparse.ArgumentParser) -> None:
    dev.add_argument("action", choices=["up", "down", "status", "fetch"])
    dev.add_argument(
        "--broker",
        choices=list(DEV_BROKERS),
        default="kafka",
        help="up: the broker beside MongoDB (nats, rabbitmq: no Java needed); fetch: fetch it",
    )
    dev.add_argument(
        "--schema-registry",
        action="store_true",
        help="up: also a Schema Registry (Apicurio, Confluent API); fetch: resolve it too",
    )
    dev.add_argument(
        "--format",
        choices=["text", "json", "env"],
        default="text",
        help="text: the JSON, then (up) the export lines; json: the JSON only; "
        'env (up, status): only the export lines, for eval "$(outbox-relay dev up --format env)"',
    )


def _add_outbox_choice(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--outbox", default=None, metavar="DATABASE.COLLECTION", help=f"{help} [RELAY_OUTBOXES]")


def _add_outbox(outbox: argparse.ArgumentParser) -> None:
    outbox.add_argument("action", choices=["init", "prune"])
    _add_outbox_choice(outbox, "act on this outbox only (default: every outbox)")
    outbox.add_argument(
        "--ttl-seconds",
        type=int,
        default=None,
        help="init: expire outbox documents after this long, delivered or not (prefer RELAY_OUTBOX_RETENTION)",
    )
    outbox.add_argument("--dry-run", action="store_true", help="prune: print what would be deleted, delete nothing")


def _add_schemas(schemas: argparse.ArgumentParser) -> None:
    schemas.add_argument("action", choices=["check"])
    schemas.add_argument("--dir", type=Path, default=None, help="schema folder (default: the installed schemas/)")
    baseline = schemas.add_mutually_exclusive_group()
    baseline.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="compare with the schemas in DIR (default: each file's previous version in git)",
    )
    baseline.add_argument(
        "--git-ref", default=None, metavar="REF", help="compare with the schema folder at git REF, e.g. origin/main"
    )
    schemas.add_argument(
        "--keep-history", action="store_true", help="copy the previous version of each changed schema into history/"
    )


def _add_tail(tail: argparse.ArgumentParser) -> None:
    tail.add_argument("topic", help="a Kafka topic; a NATS subject; a RabbitMQ binding key (printed from now on)")
    _add_outbox_choice(tail, "print only this outbox's events (by their ce_source; default: every event)")
    tail.add_argument("-n", "--last", type=int, default=10, help="start this many messages before each partition's end")
    tail.add_argument("--from-beginning", action="store_true", help="start at each partition's first message")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new messages until Ctrl-C")
    tail.add_argument("--max-messages", type=int, default=None, help="stop after printing this many")
    tail.add_argument(
        "--isolation",
        choices=["read_committed", "read_uncommitted"],
        default="read_committed",
        help="read_committed (default): what consumers see, committed Kafka transactions only; "
        "read_uncommitted: also the messages of aborted transactions",
    )


def _add_inbox(inbox: argparse.ArgumentParser) -> None:
    inbox.add_argument("action", choices=["forget"])
    inbox.add_argument("--group", default="", metavar="GROUP", help="the consumer group whose records to forget")
    inbox.add_argument(
        "--inbox",
        default=None,
        metavar="[DATABASE.]COLLECTION",
        help="the inbox collection (default: inbox, in RELAY_DATABASE when no database is given)",
    )
    inbox.add_argument("--since", metavar="TIME", help="events that occurred at or after TIME (ISO 8601, as replay's)")
    inbox.add_argument("--until", metavar="TIME", help="events that occurred at or before TIME (ISO 8601)")
    inbox.add_argument(
        "--aggregate", action="append", default=[], metavar="ID", help="only this aggregate id (repeatable)"
    )
    inbox.add_argument(
        "--aggregate-type", action="append", default=[], metavar="TYPE", help="only this aggregate type (repeatable)"
    )
    inbox.add_argument("--all", action="store_true", help="every record of the group (needed when no filter is given)")
    inbox.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")


def _add_security(security: argparse.ArgumentParser) -> None:
    security.add_argument("action", choices=["role"])
    security.add_argument("--role-name", default="outboxRelay", help="the role's name (on the admin database)")
    security.add_argument("--inbox", default=None, metavar="COLLECTION", help="also relay.inbox's collection")
    security.add_argument("--json", action="store_true", help="print the bare createRole document")
    security.add_argument(
        "--create", action="store_true", help="create the role (or set its privileges) as RELAY_MONGODB_URI's user"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_command("outbox-relay", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command: the ones without settings first, then the others with settings loaded
    and logging configured from them."""
    from relay.ops.logs import setup_logging

    missing = _missing_extra(args)
    if missing is not None:
        print(missing, file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "dev":
        return _dev(args.action, args.schema_registry, args.format, args.broker)
    if args.command == "pipeline":
        from relay.spark.pipeline import main as pipeline

        return pipeline(args.job, args.job_args)
    if args.command == "schemas":
        from relay.avro.schemas_check import run as check_schemas

        return check_schemas(args.dir, args.baseline, args.git_ref, args.keep_history)
    settings = cfg.load_settings(args)
    setup_logging(settings.log_level, settings.log_format)
    command = _WITH_SETTINGS.get(args.command)
    return EXIT_FATAL if command is None else command(settings, args)


def _status(settings: cfg.Settings, args: argparse.Namespace) -> int:
    from relay.commands.status import status

    emit(json.dumps(status(settings, args.outbox), indent=2, default=str, ensure_ascii=False))
    return 0


def _demo(settings: cfg.Settings, args: argparse.Namespace) -> int:
    from relay.dev.demo import run_demo

    with stopping_on_signals(_interrupt):  # the demo's finally stops everything it started
        return run_demo(settings, events=args.events, rate=args.rate)


def _interrupt() -> None:
    raise KeyboardInterrupt


def _outbox(settings: cfg.Settings, args: argparse.Namespace) -> int:
    from relay.commands.outbox import init_outbox, prune_outbox

    lines = (
        prune_outbox(settings, dry_run=args.dry_run, outbox=args.outbox)
        if args.action == "prune"
        else init_outbox(settings, args.ttl_seconds, outbox=args.outbox)
    )
    for line in lines:
        emit(line)
    return 0


def _tail(settings: cfg.Settings, args: argparse.Namespace) -> int:
    from relay.commands.tail import tail

    return tail(
        settings,
        args.topic,
        from_beginning=args.from_beginning,
        last=args.last,
        follow=args.follow,
        max_messages=args.max_messages,
        isolation=args.isolation,
        outbox=args.outbox,
    )


def _security(settings: cfg.Settings, args: argparse.Namespace) -> int:
    from relay.commands.security import create_role, role

    if args.create:
        emit(create_role(settings, args.role_name, args.inbox))
    else:
        emit(role(settings, args.role_name, args.inbox, as_json=args.json))
    return 0


def _replay(settings: cfg.Settings, args: argparse.Namespace) -> int:
    from relay.commands.replay import replay

    return replay(settings, args)


def _inbox(settings: cfg.Settings, args: argparse.Namespace) -> int:
    """`inbox forget`: the times parsed and the range checked by the replay's rules."""
    from relay.commands.replay_plan import check_range
    from relay.core.config import parse_time
    from relay.inbox.forget import Selection, forget_records

    now = dt.datetime.now(dt.UTC)
    since = parse_time("--since", args.since) if args.since else None
    until = parse_time("--until", args.until) if args.until else None
    if since is not None:
        checked = check_range(since, until or now, now)
        until = None if until is None else checked
    selection = Selection(args.group, since, until, tuple(args.aggregate), tuple(args.aggregate_type), args.all)
    for line in forget_records(settings, selection, args.inbox, args.dry_run):
        emit(line)
    return 0


def _checkpoint(settings: cfg.Settings, args: argparse.Namespace) -> int:
    from relay.commands.status import reset_checkpoint

    emit(reset_checkpoint(settings, force=args.force, outbox=args.outbox))
    return 0


def _run(settings: cfg.Settings) -> int:
    from relay.avro.shared_topics import shared_topics
    from relay.wiring import build

    for shared in shared_topics(settings.topic_template, settings.namespaces):
        log.warning(shared.warning(), extra={"outboxes": shared.names, "missing": shared.missing})
    group = build(settings)  # the process: one relay loop per lease it may lead
    server = group.observer.serve()
    try:
        with stopping_on_signals(group.stop, Then.DEFAULT, "finishing the batch in flight, then stopping"):
            group.run()
    finally:
        if server is not None:
            server.shutdown()
    log.info("stopped")
    return 0


def _dev(action: str, schema_registry: bool = False, fmt: str = "text", broker: str = "kafka") -> int:
    from relay.dev import stack as devstack

    if fmt == "env" and action not in ("up", "status"):
        print(f"outbox-relay dev {action}: --format env goes with up or status", file=sys.stderr)
        return EXIT_CONFIG
    if action == "fetch":
        if broker == "nats":
            from relay.dev.nats_server import VERSION, installed

            print(f"nats-server {VERSION} at {installed()}")
        elif broker == "rabbitmq":
            from relay.dev import rabbitmq_server

            print(f"rabbitmq-server {rabbitmq_server.VERSION} at {rabbitmq_server.installed().server}")
        else:
            print(f"Kafka {devstack.KAFKA_VERSION} jars in {devstack.kafka_libs()}")
        mongod = devstack.default_mongod()
        print(f"mongod {mongod.version()} at {mongod.path}")
        if schema_registry:
            from relay.dev.registry import APICURIO_VERSION, registry_home

            print(f"Apicurio Registry {APICURIO_VERSION} in {registry_home()}")
        return 0
    if action == "up":
        result = devstack.dev_up(schema_registry=schema_registry, broker=broker)
    else:
        result = {"down": devstack.dev_down, "status": devstack.dev_status}[action]()
    if fmt == "env":
        if not result.get("running"):
            print("outbox-relay dev status: no dev stack is running (outbox-relay dev up)", file=sys.stderr)
            return EXIT_UNREACHABLE
        print("\n".join(_exports(result)))
        return 0
    print(json.dumps(result, indent=2))
    if action == "up" and fmt == "text":
        print("\n" + "\n".join(_exports(result)))
    return 0


def _exports(stack: dict[str, Any]) -> list[str]:
    """`export` lines for the stack's addresses, each value single-quoted for a POSIX shell."""
    values = {"RELAY_MONGODB_URI": stack["mongodb"]["uri"]}
    if "nats" in stack:
        values |= {"RELAY_BROKER": "nats", "RELAY_NATS_SERVERS": stack["nats"]["url"]}
    elif "rabbitmq" in stack:  # no credentials in the URL: the local server's guest user, pika's default
        values |= {"RELAY_BROKER": "rabbitmq", "RELAY_RABBITMQ_URL": stack["rabbitmq"]["url"]}
    else:
        values["RELAY_KAFKA_BOOTSTRAP_SERVERS"] = stack["kafka"]["bootstrap_servers"]
    if "schema_registry" in stack:
        values["RELAY_SCHEMA_REGISTRY_URL"] = stack["schema_registry"]["url"]
    return [f"export {name}={_single_quoted(value)}" for name, value in values.items()]


def _single_quoted(value: str) -> str:
    """`value` as one POSIX shell word: in single quotes, each quote in it closed, escaped, reopened."""
    return "'" + value.replace("'", "'\\''") + "'"


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]


# The commands that need an extra of the package (pyproject.toml), and a module it brings; the
# others need only the base install (README, "Installing in a service").
_EXTRAS = {
    "dev": ("dev", "psutil"),
    "demo": ("dev", "psutil"),
    "schemas": ("schemas", "avro"),
    "pipeline": ("spark", "pyspark"),
}


def _missing_extra(args: argparse.Namespace) -> str | None:
    """The one line that stops a command whose extra is not installed, or None."""
    extra, module = _EXTRAS.get(args.command, (None, ""))
    if extra is None or importlib.util.find_spec(module) is not None:
        return None
    command = f"{args.command} {getattr(args, 'action', None) or getattr(args, 'job', '')}".strip()
    return f"outbox-relay {command}: needs the '{extra}' extra: pip install 'outbox-relay[{extra}]'"


# The commands that read the settings, by name (`_dispatch` loads the settings first).
_WITH_SETTINGS: dict[str, Callable[[cfg.Settings, argparse.Namespace], int]] = {
    "run": lambda settings, _args: _run(settings),
    "status": _status,
    "demo": _demo,
    "outbox": _outbox,
    "tail": _tail,
    "checkpoint": _checkpoint,
    "security": _security,
    "replay": _replay,
    "inbox": _inbox,
}

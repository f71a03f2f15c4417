"""`outbox-relay replay`: publish again what a consumer lost, beside the live relay (docs/replay.md).

The same messages as the live relay published, built by the same encoder (relay.avro.encoding's
MessageBuilder: key, value bytes and headers, `ce_id` included), plus a header `relay_replay`
holding the replay's id. Per outbox, the parts of the range (relay.commands.replay_plan) are read
in order: the collection before the oplog's window, then a change stream of its own inside it
(relay.mongo.replay_source). Outboxes are replayed one after the other.

Never in the live relay's way: no lease is taken and no stored checkpoint is written (the lease
documents are only read, for the fencing token the messages carry); progress is saved in a
local state file (relay.commands.replay_state) after Kafka acknowledged it.

Exit codes (README, "Exit codes"): 0 done (also when the range holds no event), 2 bad arguments
or configuration (an outbox not configured, an empty or reversed range, an invalid topic, a
refused ACL), 3 MongoDB or Kafka unreachable (also MongoDB failing the replay's change stream for
RELAY_CONNECT_TIMEOUT_S: relay.mongo.replay_source.OplogPart's recovery), 4 part of the range is
gone (clean-up removed it: `--allow-gap` goes on) or left the oplog while the replay ran, 5 a
server refused a request unexpectedly (as the relay's), 130 interrupted (SIGINT/SIGTERM: the
confirmed progress is saved; `--resume REPLAY_ID` continues).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bson import Timestamp
from pymongo import MongoClient

from relay.avro.encoding import MessageBuilder
from relay.avro.folder import SchemaFolder
from relay.avro.framing import framing_for
from relay.commands.replay_plan import Part, Removals, ReplayGapError, Source, check_range, gap, iso, plan, unseen
from relay.commands.replay_progress import Counts, Progress
from relay.commands.replay_state import OutboxProgress, ReplayState, default_state_dir, load_state
from relay.config import PartConfigs, Settings
from relay.core.change import Change
from relay.core.config import SKIP, parse_time
from relay.core.errors import ConfigError, HistoryLostError
from relay.core.message import HEADER_REPLAY, OutgoingMessage, valid_topic
from relay.core.namespace import Namespace
from relay.core.poison import PoisonPolicy, encode
from relay.core.redact import emit
from relay.core.signals import Then, stopping_on_signals
from relay.kafka.admin import check_kafka
from relay.kafka.replay_publisher import ReplayPublisher
from relay.mongo.connection import check_mongodb, mongo_client
from relay.mongo.replay_source import (
    Filters,
    OplogPart,
    Recovery,
    cleanup_record,
    cluster_now,
    collection_changes,
    complete_oplog,
    count_documents,
    document_key,
    oldest_occurred,
    oplog_window_start,
    timestamp_at,
    ttl_index,
    wall_ms,
)

log = logging.getLogger("relay")

EXIT_INTERRUPTED = 130
CHUNK_EVENTS = 1000  # messages per confirmation (and, exactly-once, per Kafka transaction)
PROGRESS_INTERVAL_S = 5.0


@dataclass(frozen=True)
class Request:
    """What to replay, as given (or as saved with the replay, for a resume)."""

    outboxes: tuple[Namespace, ...]
    since: dt.datetime
    until: dt.datetime
    until_time: Timestamp  # the cluster time the oplog parts end at
    aggregates: tuple[str, ...]
    aggregate_types: tuple[str, ...]
    to_topic: str | None
    rate_limit: float | None  # events per second (None: no limit); a resume keeps it

    def saved(self) -> dict[str, Any]:
        return {
            "outboxes": [str(n) for n in self.outboxes],
            "since": iso(self.since),
            "until": iso(self.until),
            "untilClusterTime": [self.until_time.time, self.until_time.inc],
            "aggregates": list(self.aggregates),
            "aggregateTypes": list(self.aggregate_types),
            "toTopic": self.to_topic,
            "rateLimit": self.rate_limit,
        }

    @classmethod
    def from_saved(cls, saved: dict[str, Any], settings: Settings) -> Request:
        """The saved request, its outboxes checked against the configured ones (a state saved by
        an earlier release has no rate limit: none)."""
        return cls(
            settings.pick_outboxes(saved["outboxes"]),
            parse_time("--since", saved["since"]),
            parse_time("--until", saved["until"]),
            Timestamp(*saved["untilClusterTime"]),
            tuple(saved["aggregates"]),
            tuple(saved["aggregateTypes"]),
            saved["toTopic"],
            saved.get("rateLimit"),
        )


def check_arguments(
    args: argparse.Namespace, settings: Settings, now: dt.datetime
) -> tuple[tuple[Namespace, ...], dt.datetime, dt.datetime]:
    """The outboxes and the range of a new replay, checked (no server needed); ConfigError naming
    the flag otherwise."""
    check_rate(args.rate_limit)
    if args.to_topic is not None and not valid_topic(args.to_topic):
        raise ConfigError("--to-topic", f"{args.to_topic!r} is not a valid Kafka topic name")
    if args.since is None:
        raise ConfigError("--since", "is required (the start of the range, ISO 8601), unless --resume is given")
    outboxes = settings.pick_outboxes(args.outbox)
    since = parse_time("--since", args.since)
    until = parse_time("--until", args.until) if args.until else now
    return outboxes, since, check_range(since, until, now)


def check_rate(rate_limit: float | None) -> None:
    """ConfigError naming --rate-limit unless it is None (no limit) or positive."""
    if rate_limit is not None and rate_limit <= 0:
        raise ConfigError("--rate-limit", f"must be greater than 0, got {rate_limit}")


def resumed_request(saved: Request, rate_limit: float | None) -> tuple[Request, str | None]:
    """A resumed replay's request: the saved one, its rate limit overridden by a --rate-limit given
    beside --resume (then also the line that says so)."""
    if rate_limit is None or rate_limit == saved.rate_limit:
        return saved, None
    check_rate(rate_limit)
    was = "no limit" if saved.rate_limit is None else f"{saved.rate_limit:g} events/s"
    line = f"--rate-limit {rate_limit:g} given beside --resume overrides the saved rate limit ({was})"
    return dataclasses.replace(saved, rate_limit=rate_limit), line


def resume_hint(replay_id: str, request: Request, state_dir: Path | None) -> str:
    """The summary's `resumeWith`: the command, then (a shell comment) what it keeps."""
    command = f"outbox-relay replay --resume {replay_id}" + (f" --state-dir {state_dir}" if state_dir else "")
    rate = "no rate limit" if request.rate_limit is None else f"--rate-limit {request.rate_limit:g}"
    return f"{command}  # keeps the saved range, filters, target topic and {rate}; a --rate-limit given overrides it"


def replay(settings: Settings, args: argparse.Namespace) -> int:
    """Run the replay `args` asks for (the module docstring); returns the exit code."""
    folder = args.state_dir or default_state_dir()
    client = mongo_client(settings.parts().mongo)
    try:
        return _Replay(settings, client, args, folder).run()
    finally:
        client.close()


@dataclass(frozen=True)
class _Run:
    """What every step of one replay's run shares: the request, its saved state, the oplog's
    oldest entry when it began, the producer (None in a dry run) and the progress report."""

    request: Request
    state: ReplayState
    oplog: Timestamp
    publisher: ReplayPublisher | None
    progress: Progress


class _Replay:
    """One replay: plan, check, read, publish, record progress, report."""

    def __init__(self, settings: Settings, client: MongoClient[Any], args: argparse.Namespace, folder: Path) -> None:
        self._settings = settings
        self._parts: PartConfigs = settings.parts()
        self._client = client
        self._args = args
        self._folder = folder
        self._dry_run = bool(args.dry_run)
        self._rate: float | None = None  # the request's, once known
        self._stop = threading.Event()
        self._counts = Counts()
        self._poison = PoisonPolicy(SKIP)  # an event the encoder refuses is left out (relay.core.poison)
        self._folder_schemas = SchemaFolder.bundled()

    def run(self) -> int:
        parts = self._parts
        check_mongodb(self._client, parts.mongo)
        state, request = self._request()
        if not self._dry_run:
            check_kafka(parts.kafka)
        oplog_ts = oplog_window_start(self._client)
        plans = {ns: plan(request.since, request.until, oplog_ts.as_datetime()) for ns in request.outboxes}
        self._refuse_gaps(plans, oplog_ts)
        filters = self._filters(request)
        total = sum(
            count_documents(parts.mongo.outbox(self._client, ns), filters, request.since, request.until)
            for ns in request.outboxes
        )
        self._start_line(state, request, plans, oplog_ts, total)
        progress = Progress(state.id, total, self._counts, interval_s=PROGRESS_INTERVAL_S)
        publisher = None if self._dry_run else ReplayPublisher(parts.kafka, state.id, parts.mongo.connect_timeout_s * 4)
        run = _Run(request, state, oplog_ts, publisher, progress)
        says = "finishing the chunk in flight, saving the progress, then stopping"
        with stopping_on_signals(self._stop.set, Then.INTERRUPT, says):
            try:
                interrupted = not all(self._replay_outbox(run, ns, plans[ns]) for ns in request.outboxes)
            finally:
                if publisher is not None:
                    publisher.close()
                progress.finish()
        if not interrupted and not self._dry_run:
            state.remove(self._folder)  # finished: nothing to resume (relay.commands.replay_state)
        self._summary(state, request, progress, interrupted)
        return EXIT_INTERRUPTED if interrupted else 0

    def _request(self) -> tuple[ReplayState, Request]:
        """A new replay's request and state from the flags, or a resumed one's as saved."""
        args = self._args
        if args.resume is not None:
            state = load_state(self._folder, args.resume)
            request, overridden = resumed_request(Request.from_saved(state.request, self._settings), args.rate_limit)
            state.request = request.saved()  # an overriding rate is the one a later resume keeps
            if overridden is not None:
                log.info("replay %s: %s", state.id, overridden)
            if args.since or args.until or args.outbox:
                log.warning(
                    "replay %s: --resume uses the saved range and filters; the flags given are ignored", state.id
                )
        else:
            outboxes, since, until = check_arguments(args, self._settings, dt.datetime.now(dt.UTC))
            until_time = min(Timestamp(int(until.timestamp()) + 1, 0), cluster_now(self._client))
            aggregates, types = tuple(args.aggregate), tuple(args.aggregate_type)
            request = Request(outboxes, since, until, until_time, aggregates, types, args.to_topic, args.rate_limit)
            state = ReplayState(str(uuid.uuid4()), request.saved())
        self._rate = request.rate_limit
        return state, request

    # ---- checks and reports ------------------------------------------------------------------------

    def _filters(self, request: Request) -> Filters:
        fields = self._parts.encoding.fields
        return Filters(
            fields.aggregate_id, fields.aggregate_type, fields.occurred_at, request.aggregates, request.aggregate_types
        )

    def _refuse_gaps(self, plans: dict[Namespace, list[Part]], oplog: Timestamp) -> None:
        """ReplayGapError naming what may be gone, unless --allow-gap (then a WARNING per outbox)."""
        fields = self._parts.encoding.fields
        unfiltered = Filters(fields.aggregate_id, fields.aggregate_type, fields.occurred_at)
        for namespace, parts in plans.items():
            outbox = self._parts.mongo.outbox(self._client, namespace)
            oldest = oldest_occurred(outbox, unfiltered)
            if unseen(parts, oldest) is None:
                continue
            gone = gap(namespace, parts, oldest, oplog.as_datetime(), self._removals(namespace))
            if gone is None:
                continue
            if not self._args.allow_gap:
                raise ReplayGapError(gone)
            log.warning("replay: %s", gone.replace(", or pass --allow-gap to replay what is left", ""))

    def _removals(self, namespace: Namespace) -> Removals:
        """What may have removed the outbox's documents (relay.commands.replay_plan.Removals)."""
        outbox = self._parts.mongo.outbox(self._client, namespace)
        if complete_oplog(self._client, namespace):
            return Removals(complete_oplog=True)
        known, cleaned_before = cleanup_record(self._parts.mongo.leases(self._client), self._lease_ids(namespace))
        return Removals(False, ttl_index(outbox), known, cleaned_before)

    def _start_line(
        self, state: ReplayState, request: Request, plans: dict[Namespace, list[Part]], oplog: Timestamp, total: int
    ) -> None:
        """The first line: the replay's id (the `relay_replay` header) and where each part comes from."""
        line = {
            "replay": state.id,
            "resumed": self._args.resume is not None,
            "dryRun": self._dry_run,
            "since": iso(request.since),
            "until": iso(request.until),
            "oplogStart": iso(oplog.as_datetime()),
            "expected": total,
            "rateLimit": request.rate_limit,
            "parts": {
                str(ns): [{"from": p.source.value, "start": iso(p.start), "end": iso(p.end)} for p in parts]
                for ns, parts in plans.items()
            },
        }
        emit(json.dumps(line))

    def _summary(self, state: ReplayState, request: Request, progress: Progress, interrupted: bool) -> None:
        line: dict[str, Any] = {
            "replay": state.id,
            "summary": self._counts.summary(),
            "events": self._counts.done,
            "skippedPoison": dict(self._counts.skipped),
            "seconds": round(progress.seconds, 3),
            "dryRun": self._dry_run,
        }
        if interrupted:
            line["interrupted"] = True
            line["resumeWith"] = resume_hint(state.id, request, self._args.state_dir)
        emit(json.dumps(line))

    # ---- one outbox ---------------------------------------------------------------------------------

    def _replay_outbox(self, run: _Run, namespace: Namespace, parts: list[Part]) -> bool:
        """Replay one outbox's parts in order; False when stopped by a signal (progress saved)."""
        done = run.state.outbox(namespace)
        if done.done:
            return True
        target = self._target(run, namespace)
        for part in parts:
            if part.source is Source.COLLECTION and done.collection_done:
                continue
            if not self._replay_part(run, target, part):
                return False
            if part.source is Source.COLLECTION:
                done.collection_done = True
                self._save(run.state)
        done.done = True
        self._save(run.state)
        return True

    def _target(self, run: _Run, namespace: Namespace) -> _Target:
        folder = self._folder_schemas
        encoder = MessageBuilder(self._parts.encoding_for(namespace), folder, framing_for(self._parts.registry, folder))
        return _Target(namespace, encoder, self._fencing_token(namespace), run.state.id.encode(), run.request.to_topic)

    def _replay_part(self, run: _Run, target: _Target, part: Part) -> bool:
        """Replay one part, chunk by chunk, saving the progress after each confirmed chunk; False
        when stopped by a signal."""
        done = run.state.outbox(target.namespace)
        field = self._parts.encoding.fields.occurred_at
        try:
            for batch in self._batches(run, target.namespace, part, done):
                for chunk in _chunks(iter(batch), self._chunk_size()):
                    self._replay_chunk(run, target, part.source, chunk)
                    if part.source is Source.COLLECTION:
                        done.set_collection_key(document_key(chunk[-1], field))
                    else:
                        done.oplog_after = chunk[-1].position["_data"]
                    self._save(run.state)
                    run.progress.tick()
                    if self._stop.is_set():
                        return False
        except HistoryLostError as exc:
            raise HistoryLostError.of(
                f"{target.namespace}: the start of the oplog part ({iso(part.start)})",
                "it rolled over as the replay began; run the replay again (its start is then read from the collection)",
            ) from exc
        return not self._stop.is_set()

    def _batches(self, run: _Run, namespace: Namespace, part: Part, done: OutboxProgress) -> Iterator[list[Change]]:
        """The part's changes in order, after what `done` records as confirmed."""
        filters = self._filters(run.request)
        if part.source is Source.COLLECTION:
            outbox = self._parts.mongo.outbox(self._client, namespace)
            return _chunks(
                collection_changes(outbox, filters, part.start, part.end, done.collection_key()), CHUNK_EVENTS
            )
        window = (max(timestamp_at(part.start), run.oplog), run.request.until_time)
        wall = (wall_ms(part.start), wall_ms(run.request.until))
        recovery = Recovery(self._parts.loop.restart_backoff_max_s, self._parts.mongo.connect_timeout_s, self._stop)
        reader = OplogPart(
            self._client, namespace, filters, window, wall, recovery, part.occurred_from, done.oplog_after, CHUNK_EVENTS
        )
        return reader.batches()

    def _replay_chunk(self, run: _Run, target: _Target, source: Source, chunk: list[Change]) -> None:
        """Build, publish and confirm one chunk's messages, and count them."""
        messages = self._messages(target, chunk)
        self._publish(run.publisher, messages)
        for message in messages:
            self._counts.add(target.namespace, message.topic, source.value)

    def _chunk_size(self) -> int:
        """Messages per confirmation: fewer under a rate limit, so progress is saved every second."""
        return CHUNK_EVENTS if self._rate is None else max(1, min(CHUNK_EVENTS, int(self._rate)))

    def _messages(self, target: _Target, changes: list[Change]) -> list[OutgoingMessage]:
        """The live relay's messages for `changes`, built as the loop builds them (relay.core.poison's
        `encode`), marked with the replay's id and sent to `to_topic` when given. A poison event
        (the live relay stopped at it or dead-lettered it) is skipped (the `skip` policy) with a
        WARNING and counted."""

        def skipped(event_id: str, reason: str) -> None:
            log.warning("replay: skipping poison event %s: %s", event_id, reason, extra={"event_id": event_id})
            self._counts.skip(target.namespace)

        built, _ = encode(changes, target.fencing_token, target.encoder, self._poison, skipped)
        return [
            OutgoingMessage(
                m.event_id, target.topic or m.topic, m.key, m.value, [*m.headers, (HEADER_REPLAY, target.replay_id)]
            )
            for m in built
        ]

    def _publish(self, publisher: ReplayPublisher | None, messages: list[OutgoingMessage]) -> None:
        """Send and confirm (nothing in a dry run), no faster than the rate limit."""
        if publisher is not None:
            publisher.send(messages)
            publisher.confirm()
        if self._rate is not None and messages:
            self._stop.wait(len(messages) / self._rate)

    def _save(self, state: ReplayState) -> None:
        if not self._dry_run:
            state.save(self._folder)

    def _fencing_token(self, namespace: Namespace) -> int:
        """The highest fencing token of the outbox's lease documents (read, never written): the
        `relay_fencing_token` the replayed messages carry, so the replay never looks like a fencing
        regression next to the live relay's messages (0 when no relay ever ran)."""
        leases = self._parts.mongo.leases(self._client)
        docs = leases.find({"_id": {"$in": self._lease_ids(namespace)}}, projection={"fencingToken": 1})
        return max((int(d.get("fencingToken", 0)) for d in docs), default=0)

    def _lease_ids(self, namespace: Namespace) -> list[str]:
        """The ids of the outbox's lease documents (one per partition)."""
        return [s.lease_id for s in self._parts.scopes() if s.namespace == namespace]


@dataclass(frozen=True)
class _Target:
    """How one outbox's events become replayed messages: its encoder and the fencing token they
    carry, the replay's id (the `relay_replay` header), and --to-topic (None: each event's own)."""

    namespace: Namespace
    encoder: MessageBuilder
    fencing_token: int
    replay_id: bytes
    topic: str | None


def _chunks(items: Iterator[Change], size: int) -> Iterator[list[Change]]:
    chunk: list[Change] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk

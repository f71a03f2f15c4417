"""Helpers for the pipeline tests: the oracle state from the outbox, the two views as dicts,
crafted Kafka messages, and the pipeline as a child process (stopped by its process group id).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bson import json_util
from bson.json_util import RELAXED_JSON_OPTIONS
from confluent_kafka import Producer

from relay.avro.contract import ENVELOPE
from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.message import HEADER_FENCING
from relay.dev.processes import spawn
from relay.outbox import OutboxEvent
from relay.spark.materialize import MaterializeConfig, MongoView
from relay.spark.state import read_state
from tests.spark.cluster import JAVA_TOOL_OPTIONS
from tests.support.paths import ROOT
from tests.support.relays import settings_env
from tests.support.topics import Record
from tests.support.waiting import wait_until
from tests.support.writes import Written

VIEW_COLLECTION = "aggregate_state"
REGISTRY = SchemaFolder.bundled()

# ---- the oracle --------------------------------------------------------------------------------


def outbox_state(outbox: Any, written: list[tuple[str, Written]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The state view computed from the outbox alone: per (aggregateType, aggregateId), the last
    event in commit order (the writers' order per aggregate) and the number of events.
    `written`: what each writer committed, with the aggregate type it wrote."""
    docs = {str(d["_id"]): d for d in outbox.find()}
    state: dict[tuple[str, str], dict[str, Any]] = {}
    for aggregate_type, w in written:
        for aggregate_id, ids in w.per_aggregate.items():
            last = docs[ids[-1]]
            state[(aggregate_type, aggregate_id)] = {
                "lastEventId": ids[-1], "lastEventType": last["eventType"], "lastPayload": last["payload"],
                "lastOccurredAtMs": int(last["occurredAt"].timestamp() * 1000), "eventCount": len(ids),
            }
    return state


def positions(records: list[Record]) -> dict[str, str]:
    """Event id -> source.position, from the topic."""
    return {r.id: r.position for r in records}


def _comparable(doc: dict[str, Any], payload: Any, occurred_ms: int) -> dict[str, Any]:
    return {"lastEventId": doc["lastEventId"], "lastEventType": doc["lastEventType"], "lastPayload": payload,
            "lastOccurredAtMs": occurred_ms, "eventCount": doc["eventCount"]}


def mongo_view(db: Any, collection: str = VIEW_COLLECTION) -> dict[tuple[str, str], dict[str, Any]]:
    """The MongoDB read model as {(type, id): comparable fields}, with `lastPosition` aside."""
    view = {}
    for d in db[collection].find():
        assert d["_id"] == {"aggregateType": d["aggregateType"], "aggregateId": d["aggregateId"]}
        row = _comparable(d, d["lastPayload"], int(d["lastOccurredAt"].timestamp() * 1000))
        view[(d["aggregateType"], d["aggregateId"])] = row | {"lastPosition": d["lastPosition"]}
    return view


def parquet_view(spark: Any, state_path: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The newest complete Parquet snapshot, in the same shape as `mongo_view`."""
    from pyspark.sql import functions as F

    df = read_state(spark, state_path)
    assert df is not None, f"no state snapshot under {state_path}"
    rows = df.withColumn("lastOccurredAtMs", F.unix_millis("lastOccurredAt")).collect()
    return {(r["aggregateType"], r["aggregateId"]):
            _comparable(r.asDict(), json_util.loads(r["lastPayload"]), r["lastOccurredAtMs"])
            | {"lastPosition": r["lastPosition"]} for r in rows}


def assert_view_equals_outbox(view: dict[tuple[str, str], dict[str, Any]],
                              expected: dict[tuple[str, str], dict[str, Any]], position_of: dict[str, str]) -> None:
    """Same aggregates, same last event (and its position in Kafka), same distinct-event count."""
    assert set(view) == set(expected), (f"aggregates differ: missing {sorted(set(expected) - set(view))[:5]}, "
                                        f"extra {sorted(set(view) - set(expected))[:5]}")
    wrong = {k: (view[k], expected[k]) for k in expected
             if {f: v for f, v in view[k].items() if f != "lastPosition"} != expected[k]
             or view[k]["lastPosition"] != position_of[expected[k]["lastEventId"]]}
    assert not wrong, f"{len(wrong)} aggregates differ, e.g. {next(iter(wrong.items()))}"


# ---- the pipeline ------------------------------------------------------------------------------

def materialize_config(settings: Settings, output: Path, once: bool = True) -> MaterializeConfig:
    from relay.spark.decode import topic_pattern

    return MaterializeConfig(
        bootstrap_servers=settings.kafka_bootstrap_servers, topics=(),
        topic_pattern=topic_pattern(settings.topic_template), output=str(output),
        checkpoint=str(output / "_checkpoints"),
        view=MongoView(settings.mongodb_uri, settings.database, VIEW_COLLECTION), once=once)


def pipeline_command(job: str, *args: str) -> list[str]:
    """`outbox-relay pipeline <job> ...` run with this interpreter."""
    return [sys.executable, "-m", "relay", "pipeline", job, *args]


SPARK_FLAGS = ["--master", "local[2]", "--shuffle-partitions", "2", "--spark-conf", "spark.ui.enabled=false"]


@dataclass
class PipelineProcess:
    """`outbox-relay pipeline <job>` as a child process in its own process group; SIGKILL goes
    to that group (the Python driver, its JVM and the Python workers) by its id."""

    argv: list[str]
    settings: Settings
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PipelineProcess:
        # Spark's scratch folder goes next to the log: a SIGKILL skips the job's own clean-up.
        scratch = self.log_path.parent / f"{self.log_path.stem}-tmp"
        scratch.mkdir(exist_ok=True)
        with open(self.log_path, "ab") as log:
            env = settings_env(self.settings) | {"TMPDIR": str(scratch), "JAVA_TOOL_OPTIONS": JAVA_TOOL_OPTIONS}
            self.proc = spawn(pipeline_command(*self.argv), env=env, cwd=ROOT,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill(self) -> None:
        """SIGKILL to the whole group (pgid = the child's pid), then reap."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self, timeout: float = 90) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.cleanup()

    def cleanup(self) -> None:
        """Kill whatever is left of the group (a JVM outliving its driver)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """tests.support.waiting.wait_until, failing with the end of this process's log (and early if
        the process exited)."""
        def check() -> Any:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"pipeline exited ({self.proc.returncode}) before {what}; "
                                     f"log:\n{self.log()[-4000:]}")
            return predicate()
        try:
            return wait_until(check, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; log:\n{self.log()[-4000:]}") from None


# ---- crafted messages --------------------------------------------------------------------------

def relay_value(event: OutboxEvent, settings: Settings, position: str) -> bytes:
    """The value the relay would write for `event` at `position`, with the relay's encoder."""
    return REGISTRY.encode(ENVELOPE, {
        "id": event.id_str, "aggregateType": event.aggregate_type, "aggregateId": event.aggregate_id,
        "eventType": event.event_type, "occurredAt": event.occurred_at,
        "payload": json_util.dumps(event.payload, json_options=RELAXED_JSON_OPTIONS),
        "source": {"database": settings.database, "collection": settings.outbox_collection,
                   "clusterTime": 0, "position": position},
    })


def relay_headers(event: OutboxEvent, fencing_token: int) -> list[tuple[str, bytes]]:
    when = event.occurred_at.astimezone(dt.UTC).isoformat(timespec="milliseconds")
    return [("ce_id", event.id_str.encode()), ("ce_type", event.event_type.encode()),
            ("ce_source", b"/outbox-relay/test"), ("ce_specversion", b"1.0"), ("ce_time", when.encode()),
            ("ce_subject", event.aggregate_id.encode()), ("content-type", b"application/avro"),
            (HEADER_FENCING, str(fencing_token).encode())]


def produce(bootstrap: str, messages: list[dict[str, Any]]) -> None:
    """Produce each message (topic, partition, key, value, headers) in order; wait for all."""
    errors: list[Any] = []
    with Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}) as producer:
        for m in messages:
            producer.produce(m["topic"], value=m["value"], key=m["key"], headers=m["headers"],
                             partition=m["partition"], on_delivery=lambda err, _msg: errors.append(err) if err else None)
            producer.poll(0)
        assert producer.flush(30) == 0 and not errors, errors


def copies_of(records: list[Record], bootstrap: str) -> None:
    """Re-publish existing messages unchanged (same topic, partition, key, value and headers), as a
    relay replay would: one pass over each partition up to the newest wanted offset."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    wanted = {(r.topic, r.partition, r.offset) for r in records}
    last = {}
    for topic, partition, offset in wanted:
        last[(topic, partition)] = max(offset, last.get((topic, partition), -1))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "copier", "enable.auto.commit": False})
    messages: dict[tuple[str, int, int], dict[str, Any]] = {}
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in last])
        pending = set(last)
        deadline = time.monotonic() + 60
        while pending:
            assert time.monotonic() < deadline, f"could not read {sorted(pending)} to the copied offsets"
            msg = consumer.poll(1)
            if msg is None or msg.error() is not None:
                continue
            where = (msg.topic(), msg.partition(), msg.offset())
            if where in wanted:
                messages[where] = {"topic": msg.topic(), "partition": msg.partition(), "key": msg.key(),
                                   "value": msg.value(), "headers": msg.headers() or []}
            if msg.offset() >= last[(msg.topic(), msg.partition())]:
                pending.discard((msg.topic(), msg.partition()))
    finally:
        consumer.close()
    produce(bootstrap, [messages[w] for w in sorted(wanted)])

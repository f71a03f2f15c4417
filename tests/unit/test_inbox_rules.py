"""The inbox's rules with in-memory values, no server: what a batch runs, what it skips, which
offsets it commits, where it stops at a poison message, what a rebalance drops, when a batch is
complete; how a batch is retried (one policy, blocking or awaited) and how a stop ends a wait;
run's options; decoding in both framings and envelopes (the Confluent one through
confluent-kafka's mock registry, `mock://`); the dead-letter record. Both inboxes use every rule
here."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import pytest
from bson import Decimal128, ObjectId

from relay.avro.folder import SchemaFolder
from relay.config import Settings
from relay.core.errors import ConfigError
from relay.inbox import InboxEvent
from relay.inbox.batching import (
    BatchLimits,
    Gathering,
    Poisoned,
    offsets_to_commit,
    plan,
    split_at_poison,
    without_partitions,
)
from relay.inbox.config import RunOptions
from relay.inbox.decoding import EventDecoder, UndecodableMessageError
from relay.inbox.poison import HEADER_SOURCE, dead_letter
from relay.outbox import OutboxEvent
from relay.wiring import message_builder
from tests.changes import change_value

TOKEN = {"_data": "826B02209A000000012B042C0100296E5A1004ABCDEF"}


@dataclass(frozen=True)
class Msg:
    """A consumed, decoded message as the rules see it."""

    event_id: str
    partition: int
    offset: int
    topic: str = "t"


def ids(events) -> list[str]:
    return [e.event_id for e in events]


# ---- what runs, what is skipped ---------------------------------------------------------------

def test_events_already_recorded_are_skipped_and_the_rest_run_in_delivery_order():
    batch = [Msg("a", 0, 1), Msg("b", 0, 2), Msg("c", 1, 7), Msg("d", 0, 3)]
    result = plan(batch, recorded={"b", "x"})
    assert ids(result.run) == ["a", "c", "d"]
    assert ids(result.skip) == ["b"]


def test_a_duplicate_inside_one_batch_runs_once_the_first_time_it_appears():
    batch = [Msg("a", 0, 1), Msg("b", 1, 4), Msg("a", 2, 9), Msg("b", 1, 5)]  # a relay replay, new offsets
    result = plan(batch, recorded=set())
    assert [(e.event_id, e.offset) for e in result.run] == [("a", 1), ("b", 4)]
    assert [(e.event_id, e.offset) for e in result.skip] == [("a", 9), ("b", 5)]


def test_a_batch_of_only_duplicates_runs_nothing_but_still_commits_its_offsets():
    batch = [Msg("a", 0, 10), Msg("b", 0, 11)]
    assert plan(batch, recorded={"a", "b"}).run == []
    assert offsets_to_commit(batch) == {("t", 0): 12}


# ---- offsets ------------------------------------------------------------------------------------

def test_offsets_to_commit_are_one_past_the_last_message_of_each_partition_in_the_batch():
    batch = [Msg("a", 0, 5), Msg("b", 1, 3), Msg("c", 0, 6), Msg("d", 1, 4), Msg("e", 2, 0, topic="u")]
    assert offsets_to_commit(batch) == {("t", 0): 7, ("t", 1): 5, ("u", 2): 1}
    assert offsets_to_commit([]) == {}


# ---- poison messages ----------------------------------------------------------------------------

def test_a_batch_is_applied_only_up_to_its_first_poison_message():
    poison = Poisoned("t", 1, 8, "p", "cannot decode")
    later = Poisoned("t", 0, 9, None, "cannot decode")
    batch = [Msg("a", 0, 7), poison, Msg("b", 0, 8), later, Msg("c", 1, 9)]
    head, found, rest = split_at_poison(batch)
    assert ids(head) == ["a"] and found is poison
    assert rest == [Msg("b", 0, 8), later, Msg("c", 1, 9)]
    # Nothing after the poison message is committed with the head: not even other partitions'.
    assert offsets_to_commit(head) == {("t", 0): 8}


def test_a_batch_without_poison_is_applied_whole():
    batch = [Msg("a", 0, 7), Msg("b", 1, 8)]
    assert split_at_poison(batch) == (batch, None, [])


# ---- rebalances -----------------------------------------------------------------------------------

def test_a_revocation_drops_the_lost_partitions_messages_from_the_batch_being_gathered():
    batch = [Msg("a", 0, 1), Msg("b", 1, 1), Msg("c", 2, 1), Msg("d", 1, 2)]
    kept = without_partitions(batch, {("t", 1)})
    assert ids(kept) == ["a", "c"]
    assert ("t", 1) not in offsets_to_commit(kept)


# ---- batch limits ---------------------------------------------------------------------------------

def test_a_batch_closes_at_its_event_count_or_its_time_after_the_first_message():
    limits = BatchLimits(max_events=3, max_seconds=0.2)
    assert not limits.closed(0, None, 100.0)  # nothing yet: keep polling
    assert not limits.closed(2, 100.0, 100.1)
    assert limits.closed(2, 100.0, 100.2)
    assert limits.closed(3, 100.0, 100.0)
    assert limits.room(2) == 1 and limits.room(5) == 0
    with pytest.raises(ValueError, match="positive"):
        BatchLimits(max_events=0)


def test_a_batch_being_gathered_waits_idle_first_then_until_it_closes_or_a_poll_returns_nothing():
    gathering = Gathering(BatchLimits(max_events=3, max_seconds=0.2), idle_s=0.5)
    assert gathering.wait(0, 100.0) == 0.5  # nothing yet: an idle poll, short enough to notice a stop
    assert not gathering.polled(0, 0, 100.5)  # it returned nothing: an empty batch
    assert gathering.polled(1, 1, 100.5)  # the first message: the batch's clock starts
    assert gathering.wait(1, 100.6) == pytest.approx(0.1)  # what is left of max_seconds
    assert gathering.polled(2, 1, 100.6)
    assert not gathering.polled(2, 0, 100.65)  # caught up: close it now, do not wait the rest
    assert gathering.wait(3, 100.6) is None  # full
    assert Gathering(BatchLimits(3, 0.2), 0.5, first_at=100.0).wait(1, 100.2) is None  # time is up


def test_a_revocation_that_empties_the_batch_being_gathered_ends_it():
    gathering = Gathering(BatchLimits(max_events=10, max_seconds=0.2), idle_s=0.5, first_at=100.0)
    assert not gathering.polled(0, 4, 100.1)  # 4 received, none kept: all of a revoked partition


# ---- retries: one policy, both forms ---------------------------------------------------------------

def _retry(stop=None, max_s=0.2):
    from relay.inbox.retrying import Retry
    from relay.inbox.stopping import StopSignal

    told: list[tuple[str, float]] = []
    stop = stop or StopSignal()
    return Retry(max_s, stop, lambda exc, wait: told.append((type(exc).__name__, wait))), told, stop


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_retryable_failure_is_retried_with_growing_waits_and_anything_else_raised_at_once(form):
    import asyncio

    from pymongo.errors import AutoReconnect, DuplicateKeyError

    retry, told, _ = _retry(max_s=0.3)
    failures = [AutoReconnect("reset")] * 3

    def attempt():
        if failures:
            raise failures.pop(0)
        return "done"

    async def attempt_async():
        return attempt()

    run = retry.call if form == "sync" else (lambda fn: asyncio.run(retry.call_async(fn)))
    assert run(attempt if form == "sync" else attempt_async) == "done"
    assert told == [("AutoReconnect", 0.1), ("AutoReconnect", 0.2), ("AutoReconnect", 0.3)]  # capped at max
    failures.append(DuplicateKeyError("E11000"))
    with pytest.raises(DuplicateKeyError):
        run(attempt if form == "sync" else attempt_async)
    assert len(told) == 3  # not retried


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_stop_asked_while_an_attempt_fails_raises_stop_requested_with_the_failure(form):
    import asyncio

    from pymongo.errors import AutoReconnect

    from relay.inbox.stopping import StopRequested

    retry, told, stop = _retry()

    def attempt():
        stop.set()  # e.g. SIGTERM while the transaction ran
        raise AutoReconnect("no primary")

    async def attempt_async():
        attempt()

    run = (lambda: retry.call(attempt)) if form == "sync" else (lambda: asyncio.run(retry.call_async(attempt_async)))
    with pytest.raises(StopRequested) as stopped:
        run()
    assert isinstance(stopped.value.cause, AutoReconnect) and told == []


def test_an_async_wait_ends_when_the_stop_is_asked_from_another_thread():
    import asyncio
    import threading
    import time

    from relay.inbox.stopping import StopSignal

    stop = StopSignal()

    async def main():
        stop.attach(asyncio.get_running_loop())
        threading.Timer(0.05, stop.set).start()
        started = time.monotonic()
        asked = await stop.wait_async(30)
        return asked, time.monotonic() - started

    asked, waited = asyncio.run(main())
    assert asked and waited < 29  # woken by the stop, not by the end of the wait
    stop.detach()
    stop.set()  # no loop attached any more: only the flag
    assert stop.is_set() and stop.wait(0)


# ---- options ---------------------------------------------------------------------------------------

def test_run_options_force_read_committed_and_manual_commits_and_name_bad_keys():
    opts = RunOptions.of(["x"], "g", "b:9092", {"kafka": {"fetch.min.bytes": "1"}})
    conf = opts.consumer_config()
    assert conf["isolation.level"] == "read_committed" and conf["enable.auto.commit"] == "false"
    assert conf["group.id"] == "g" and conf["fetch.min.bytes"] == "1"
    assert RunOptions.of("x", "g", "b", {}).topics == ("x",)
    with pytest.raises(ConfigError, match="batch_size"):
        RunOptions.of(["x"], "g", "b", {"batch_size": 3})
    with pytest.raises(ConfigError, match="enable.auto.commit"):
        RunOptions.of(["x"], "g", "b", {"kafka": {"enable.auto.commit": "true"}})
    with pytest.raises(ConfigError, match="on_poison"):
        RunOptions.of(["x"], "g", "b", {"on_poison": "skip"})
    with pytest.raises(ConfigError, match="topics"):
        RunOptions.of([], "g", "b", {})


# ---- decoding ---------------------------------------------------------------------------------------

def _message(doc: dict, schema_registry_url: str = ""):
    settings = Settings().replace(schema_registry_url=schema_registry_url)
    return message_builder(settings, SchemaFolder.bundled()).build(change_value(doc, TOKEN), 1)


@pytest.mark.parametrize("framing", ["single-object", "confluent"])
def test_both_envelopes_decode_to_the_outbox_fields_in_both_framings(framing):
    url = f"mock://{uuid.uuid4().hex}" if framing == "confluent" else ""
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    oid = ObjectId()
    typed = OutboxEvent.new("order", "o-1", "OrderCreated", {"orderId": "o-1", "amount": 9.5, "step": 1},
                            occurred_at=at, headers={"team": "blue"}, trace_context=False)
    generic = OutboxEvent.new("order", "o-1", "Noted", {"ref": oid, "n": Decimal128("1.10"), "at": at},
                              occurred_at=at, trace_context=False)
    decoder = EventDecoder(schema_registry_url=url)
    for event in (typed, generic):
        msg = _message(event.to_document(), url)
        got = decoder.decode(msg.topic, 2, 41, msg.value, {k: v.decode() for k, v in msg.headers})
        want = InboxEvent(event.id_str, "order", "o-1", event.event_type, dict(event.payload), at,
                          dict(event.headers) if event.headers else None, msg.topic, 2, 41)
        assert got == want


def test_values_the_relay_did_not_write_are_undecodable_with_the_reason():
    decoder = EventDecoder()
    with pytest.raises(UndecodableMessageError, match="single-object"):
        decoder.decode("t", 0, 0, b"{\"id\": 1}", {})
    with pytest.raises(UndecodableMessageError, match="no value"):
        decoder.decode("t", 0, 0, None, {})
    with pytest.raises(UndecodableMessageError, match="Schema Registry"):
        decoder.decode("t", 0, 0, b"\x00\x00\x00\x00\x01rest", {})


def test_a_dead_letter_keeps_the_message_and_adds_the_reason_and_where_it_came_from():
    poisoned = Poisoned("orders", 2, 41, "e-1", "handler raised ValueError: no")
    letter = dead_letter(poisoned, "dlq", "shipping", b"k", b"v", [("ce_type", b"X")])
    headers = dict(letter.headers)
    assert (letter.topic, letter.key, letter.value) == ("dlq", b"k", b"v")
    assert headers["relay_dead_letter_reason"] == b"handler raised ValueError: no"
    assert headers[HEADER_SOURCE] == b"orders/2/41" and headers["ce_id"] == b"e-1" and headers["ce_type"] == b"X"


def test_one_predicate_decides_which_errors_retry_the_batch():
    from pymongo.errors import (
        AutoReconnect,
        ConfigurationError,
        DuplicateKeyError,
        ExecutionTimeout,
        InvalidOperation,
        NotPrimaryError,
        OperationFailure,
        ServerSelectionTimeoutError,
        WTimeoutError,
    )

    from relay.core.errors import SchemaRegistryRefusedError, SchemaRegistryUnavailableError
    from relay.inbox.errors import retryable

    assert retryable(AutoReconnect("connection reset"))
    assert retryable(NotPrimaryError("not primary"))
    assert retryable(ServerSelectionTimeoutError("no primary"))
    assert retryable(ExecutionTimeout("operation exceeded time limit", code=50))
    assert retryable(WTimeoutError("waiting for replication timed out", code=64))
    assert retryable(OperationFailure("write conflict", code=112))
    assert retryable(OperationFailure("no such transaction", code=251,
                                      details={"errorLabels": ["TransientTransactionError"]}))
    assert retryable(SchemaRegistryUnavailableError("cannot reach the Schema Registry"))
    assert not retryable(OperationFailure("Transaction numbers are only allowed on a replica set member", code=20))
    assert not retryable(OperationFailure("not authorized", code=13))
    assert not retryable(DuplicateKeyError("E11000"))  # from a handler: its event is poison
    assert not retryable(InvalidOperation("Can only use session with the MongoClient that started it"))
    assert not retryable(InvalidOperation("Cannot use ended session"))
    assert not retryable(ConfigurationError("unknown option"))
    assert not retryable(SchemaRegistryRefusedError("401 unauthorized"))
    assert not retryable(ValueError("a handler's own error"))


# ---- the Schema Registry while decoding: the value's fault, or the registry's ---------------------

class _RegistryFailing:
    """A registry client whose every request fails with `exc`."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __getattr__(self, name):  # get_schema, get_associations_by_resource_name, ...
        def fail(*a, **kw):
            raise self.exc
        return fail

    def config(self):
        return {"url": "http://user:secret@registry:8081"}


CONFLUENT_VALUE = b"\x00\x00\x00\x00\x07\x02ab"  # schema id 7


def test_registry_failures_while_decoding_are_transient_refused_or_the_values_fault():
    from confluent_kafka.schema_registry import SchemaRegistryError
    from confluent_kafka.schema_registry.common._httpx_compat import httpx  # httpx2 or httpx, as the client

    from relay.avro.framing import MessageDecoder
    from relay.core.errors import SchemaRegistryRefusedError, SchemaRegistryUnavailableError

    cases = [
        (SchemaRegistryError(503, 50301, "unavailable"), SchemaRegistryUnavailableError),
        (SchemaRegistryError(429, 429, "too many requests"), SchemaRegistryUnavailableError),
        (httpx.ConnectError("connection refused"), SchemaRegistryUnavailableError),
        (httpx.ReadTimeout("timed out"), SchemaRegistryUnavailableError),
        (ConnectionRefusedError("refused"), SchemaRegistryUnavailableError),
        (SchemaRegistryError(401, 40101, "unauthorized"), SchemaRegistryRefusedError),
        (SchemaRegistryError(404, -1, "Unknown Schema Registry Error: <html>"), SchemaRegistryRefusedError),  # no registry
        (SchemaRegistryError(404, 40403, "Schema not found"), UndecodableMessageError),  # the value names no schema
    ]
    for exc, kind in cases:
        decoder = EventDecoder()
        decoder._decoder = MessageDecoder(SchemaFolder.bundled(), _RegistryFailing(exc))  # type: ignore[arg-type]
        with pytest.raises(kind) as raised:
            decoder.decode("t", 0, 0, CONFLUENT_VALUE, {})
        assert "secret" not in str(raised.value), raised.value
        assert isinstance(raised.value, ValueError) == (kind is UndecodableMessageError)


def test_a_registry_nobody_listens_on_is_unavailable_not_undecodable():
    """A real HTTP client against a closed port (the client's own retries take a few seconds)."""
    from relay.core.errors import SchemaRegistryUnavailableError

    with pytest.raises(SchemaRegistryUnavailableError, match="cannot reach the Schema Registry"):
        EventDecoder(schema_registry_url="http://127.0.0.1:9").decode("t", 0, 0, CONFLUENT_VALUE, {})


def test_an_unknown_single_object_fingerprint_is_the_values_fault():
    """The folder is the registry of single-object encoding: a fingerprint it lacks is poison."""
    with pytest.raises(UndecodableMessageError, match="unknown writer schema fingerprint"):
        EventDecoder().decode("t", 0, 0, b"\xc3\x01" + bytes(8) + b"\x02ab", {})


def test_the_registrys_basic_auth_is_an_option_checked_and_kept_out_of_the_repr():
    opts = RunOptions.of(["x"], "g", "b", {"schema_registry_url": "http://r:8081", "schema_registry_basic_auth": "u:pw"})
    assert "pw" not in repr(opts)
    with pytest.raises(ConfigError, match="schema_registry_basic_auth"):
        RunOptions.of(["x"], "g", "b", {"schema_registry_basic_auth": "no-colon"})


def test_kafka_credentials_in_the_options_are_masked_in_their_repr_and_in_what_is_printed():
    from relay.core.redact import scrub

    opts = RunOptions.of(["x"], "g", "b", {
        "kafka": {"sasl.password": "Canary-Sasl-7", "linger.ms": "5"},
        "schema_registry_url": "http://reader:Canary-Url-8@r:8081", "schema_registry_basic_auth": "u:Canary-Auth-9"})
    shown = repr(opts)
    assert "Canary" not in shown and "linger.ms': '5'" in shown and "reader:***@" in shown
    assert "Canary" not in scrub("from a driver: Canary-Sasl-7, Canary-Url-8, Canary-Auth-9")


def test_lag_per_partition_comes_from_librdkafkas_statistics_for_assigned_partitions_only():
    from relay.inbox.consumer import partition_lags

    stats = {"topics": {"t": {"partitions": {"0": {"consumer_lag": 4}, "1": {"consumer_lag": -1},
                                             "2": {"consumer_lag": 9}, "-1": {"consumer_lag": -1}}}}}
    assert partition_lags(stats, {("t", 0), ("t", 1)}) == {("t", 0): 4}  # 1 unknown yet, 2 not ours
    assert partition_lags({}, {("t", 0)}) == {}
    assert RunOptions.of(["x"], "g", "b", {}).consumer_config()["statistics.interval.ms"] == "5000"


def test_the_demos_shipping_service_decodes_with_the_relays_schema_registry():
    import types

    from relay.dev.demo import ShippingService

    settings = Settings().replace(schema_registry_url="http://registry:8081", schema_registry_basic_auth="u:pw")
    options = dict(ShippingService(types.SimpleNamespace(demo_inbox=None), settings, "t").run_options)  # type: ignore[arg-type]
    parsed = RunOptions.of(options.pop("topics"), options.pop("group_id"), options.pop("bootstrap_servers"), options)
    assert (parsed.schema_registry_url, parsed.schema_registry_basic_auth) == ("http://registry:8081", "u:pw")


def test_the_options_table_and_the_readme_list_every_run_option_with_its_default():
    from dataclasses import MISSING, fields

    from tests.support.paths import ROOT

    def shown(value) -> str:
        if isinstance(value, str):
            return value or '""'
        return f"{value:g}" if isinstance(value, float) else str(value)

    doc = (ROOT / "docs" / "inbox.md").read_text().split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    table = {cells[0].strip("` "): cells[1].strip("` ") for line in doc.splitlines() if line.startswith("| `")
             for cells in [line.strip("|").split("|")]}
    readme = (ROOT / "README.md").read_text().split("## Consuming the events\n", 1)[1].split("\n## ", 1)[0]
    readme = " ".join(readme.split())
    for f in fields(RunOptions):
        if f.name in ("topics", "group_id", "bootstrap_servers"):
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        assert table.get(f.name) == shown(default if not isinstance(default, dict) else "{}"), f.name
        listed = f'{f.name}="{default}"' if isinstance(default, str) else f"{f.name}={shown(default)}"
        assert listed in readme, listed
    assert len(table) == len(fields(RunOptions)) - 3


def test_a_partition_of_a_topic_not_subscribed_to_is_warned_about_once_naming_group_and_topic():
    """A group id shared by consumers of different topics: the group's leader may hand this inbox
    a partition of another topic (sync and async inboxes share KafkaSource). No broker is needed:
    librdkafka calls `on_assign` with the group's assignment; here the test does."""
    from confluent_kafka import TopicPartition

    from relay.inbox.config import RunOptions
    from relay.inbox.consumer import KafkaSource
    from tests.support.logs import captured_logs

    options = RunOptions.of(["orders"], "shipping", "127.0.0.1:9", {})
    source = KafkaSource(options)
    try:
        with captured_logs() as logs:
            source._on_assign(None, [TopicPartition("orders", 0), TopicPartition("payments", 0)])
            source._on_assign(None, [TopicPartition("payments", 1), TopicPartition("orders", 1)])
            source._on_assign(None, [TopicPartition("orders", 2)])
        warned = [line for line in logs.lines() if line["level"] == "WARNING"]
        assert len(warned) == 1, warned
        assert warned[0]["group"] == "shipping" and warned[0]["topic"] == "payments"
        assert "shipping" in warned[0]["message"] and "payments" in warned[0]["message"]
    finally:
        source.close()

"""Token arithmetic, pipeline fingerprints, and the error tree with its classifiers (pure logic)."""

from __future__ import annotations

import inspect

import pytest
from confluent_kafka import KafkaError, KafkaException
from pymongo.errors import AutoReconnect, CursorNotFound, NetworkTimeout, OperationFailure, WriteConcernError

import relay.core.errors as errors
from relay.core.errors import (
    Action,
    BatchRefusedError,
    ConfigError,
    DeliveryError,
    HistoryLostError,
    LeaseLostError,
    PoisonEventError,
    ProducerFencedError,
    ReopenableStreamError,
    ServerError,
    classify,
)
from relay.core.namespace import Namespace
from relay.core.positions import ClusterTime, token_cluster_time
from relay.kafka import errors as kafka_errors
from relay.mongo import errors as mongo_errors
from relay.mongo.pipeline import PIPELINE, pipeline_fingerprint
from relay.wiring import DRIVER_ERRORS


def test_token_cluster_time_reads_the_keystring_timestamp():
    assert token_cluster_time({"_data": "826B02209A000000042B0229296E04"}) == ClusterTime(0x6B02209A, 4)
    assert token_cluster_time({"_data": "not-a-token"}) is None
    assert token_cluster_time(None) is None


def test_pipeline_fingerprint_depends_on_namespace_and_pipeline():
    base = pipeline_fingerprint(Namespace("app", "outbox"))
    assert base == pipeline_fingerprint(Namespace("app", "outbox"), PIPELINE)
    assert base != pipeline_fingerprint(Namespace("app", "other"))
    assert base != pipeline_fingerprint(Namespace("app", "outbox"), [{"$match": {"operationType": "insert"}}])


def test_every_error_kind_says_its_action_itself():
    """The action is stated by each kind (or its direct base of the same meaning), never taken
    from where a class sits in the tree: a poison event is not a 'stop' error, a refused batch
    not a 'transient' one."""
    kinds = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.RelayError)]
    for kind in kinds:
        declared = next(k for k in kind.__mro__ if "action" in vars(k))
        assert declared is not errors.RelayError or kind is errors.RelayError, f"{kind.__name__} inherits the default"
    assert PoisonEventError.action is Action.POISON and PoisonEventError.exit_code == errors.EXIT_DATA
    assert BatchRefusedError.action is Action.POISON
    assert ReopenableStreamError.action is Action.REOPEN
    assert ProducerFencedError.action is LeaseLostError.action is Action.FENCED


def test_the_classifier_takes_the_kinds_action_and_asks_the_drivers_for_theirs():
    classify_ = lambda exc: classify(exc, DRIVER_ERRORS)  # noqa: E731 - as the wiring passes it
    assert classify_(DeliveryError("e1", "timed out")) is Action.RESTART
    assert classify_(ServerError("election")) is Action.RESTART
    assert classify_(AutoReconnect("connection closed")) is Action.RESTART
    assert classify_(WriteConcernError("waiting for replication timed out", 64, {})) is Action.RESTART
    assert classify_(KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))) is Action.RESTART
    assert classify_(KafkaException(KafkaError(KafkaError._FENCED))) is Action.FENCED
    assert classify_(OperationFailure("stepped down", 189)) is Action.RESTART
    assert classify_(LeaseLostError("lost")) is Action.FENCED
    assert classify_(PoisonEventError("e1", "bad")) is Action.POISON
    assert classify_(BatchRefusedError("refused", 3)) is Action.POISON
    assert classify_(HistoryLostError("gone")) is Action.STOP
    assert classify_(ConfigError("RELAY_X", "bad")) is Action.STOP
    assert classify_(OperationFailure("unauthorized", 13)) is Action.STOP
    assert classify_(ValueError("bug")) is Action.STOP
    assert classify(AutoReconnect("no driver classifier given")) is Action.STOP


def test_history_lost_and_reopenable_codes_are_translated():
    assert isinstance(mongo_errors.translate(OperationFailure("gone", 286)), HistoryLostError)
    err = mongo_errors.translate(OperationFailure("fatal", 280))
    assert isinstance(err, ReopenableStreamError) and err.code == 280
    assert "ChangeStreamFatalError" in str(err)
    assert classify(err) is Action.REOPEN


@pytest.mark.parametrize("exc, resumable", [
    (AutoReconnect("connection closed"), True),
    (NetworkTimeout("timed out"), True),
    (CursorNotFound("cursor id 7 not found", 43), True),
    (OperationFailure("labelled", 10107, {"errorLabels": ["ResumableChangeStreamError"]}), True),
    (OperationFailure("history lost", 286), False),
    (OperationFailure("capped position lost", 136), False),
    (OperationFailure("no label", 10107), False),
])
def test_resumable_errors_follow_the_change_streams_spec(exc, resumable):
    assert mongo_errors.resumable(exc) is resumable


def test_a_kafka_configuration_error_names_the_setting_and_keeps_librdkafkas_error():
    from relay.kafka.producer import IdempotentPublisher

    with pytest.raises(ConfigError) as err:
        IdempotentPublisher({"bootstrap.servers": "x:1", "no.such.property": "1"})
    assert err.value.setting == "RELAY_KAFKA_NO_SUCH_PROPERTY"
    assert isinstance(err.value.__cause__, KafkaException)
    assert "KafkaException: " in (errors.cause_of(err.value) or "")
    assert kafka_errors.fenced(KafkaError(KafkaError.PRODUCER_FENCED))


def test_kraft_cluster_ids_never_start_with_a_dash():
    from relay.dev.stack import _cluster_id

    ids = [_cluster_id() for _ in range(2000)]  # about 31 of 2,000 raw ids start with "-"
    assert all(not i.startswith("-") and len(i) == 22 for i in ids)


def test_kafka_errors_are_translated_by_one_table_naming_what_the_step_needs():
    from relay.core.errors import PermissionDeniedError, ProducerFatalError
    from relay.kafka.errors import CODES, Attempt, Treat, producing, translate

    def err(code: int, fatal: bool = False) -> KafkaError:
        return KafkaError(code, "broker says no", fatal=fatal)

    produce = producing(["orders"], "e1")
    denied = translate(err(KafkaError.TOPIC_AUTHORIZATION_FAILED), produce)
    assert isinstance(denied, PermissionDeniedError)
    assert denied.refused == [("WRITE, DESCRIBE (TOPIC_AUTHORIZATION_FAILED)", "TOPIC orders")]
    assert "refused to produce" in str(denied)
    create = Attempt("create the offsets topic", (("TOPIC", "relay.offsets", "CREATE"),))
    assert translate(err(KafkaError.TOPIC_AUTHORIZATION_FAILED), create).refused == [  # type: ignore[attr-defined]
        ("CREATE (TOPIC_AUTHORIZATION_FAILED)", "TOPIC relay.offsets")]
    cluster = translate(err(KafkaError.CLUSTER_AUTHORIZATION_FAILED, fatal=True), produce)
    assert cluster.refused[0][1] == "CLUSTER kafka-cluster"  # type: ignore[attr-defined]
    poison = translate(err(KafkaError.MSG_SIZE_TOO_LARGE), produce)
    assert isinstance(poison, PoisonEventError) and poison.event_id == "e1"
    batch = translate(err(KafkaError.MSG_SIZE_TOO_LARGE), producing(["orders"], "e1", batch=7))
    assert isinstance(batch, BatchRefusedError) and batch.events == 7
    assert isinstance(translate(err(KafkaError.PRODUCER_FENCED, fatal=True), produce), ProducerFencedError)
    timeout = translate(err(KafkaError.INVALID_TRANSACTION_TIMEOUT), produce)
    assert isinstance(timeout, ConfigError) and timeout.setting == "RELAY_KAFKA_TRANSACTION_TIMEOUT_MS"
    assert isinstance(translate(err(KafkaError._MSG_TIMED_OUT, fatal=True), produce), ProducerFatalError)
    assert isinstance(translate(err(KafkaError._MSG_TIMED_OUT), produce), DeliveryError)
    assert {c.treat for c in CODES.values()} == set(Treat)
    assert kafka_errors.action_for(KafkaException(err(KafkaError.GROUP_AUTHORIZATION_FAILED))) is Action.STOP


def test_a_produce_refusal_names_the_topic_of_the_message_handed_over():
    """A refusal by produce() itself (here: a fatal error librdkafka raises from it) names the
    event's topic, not an empty resource."""
    from relay.core.message import OutgoingMessage
    from relay.core.window import Parcel
    from relay.kafka.producer import IdempotentPublisher

    class Refusing(IdempotentPublisher):
        def _produce_all(self, parcel, while_waiting):
            self._producer = RefusingProducer()
            super()._produce_all(parcel, while_waiting)

    class RefusingProducer:
        def produce(self, *args, **kwargs):
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

        def poll(self, timeout):
            return 0

    publisher = Refusing({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": "1000"})
    real = publisher._producer
    message = OutgoingMessage("e9", "orders", b"k", b"v", [])
    with pytest.raises(Exception) as refused:
        publisher.send(Parcel([1], [message], None, 0.0), lambda: None)
    assert refused.value.refused == [("WRITE, DESCRIBE (TOPIC_AUTHORIZATION_FAILED)", "TOPIC orders")]  # type: ignore[attr-defined]
    real.purge()


def test_a_produce_refused_because_the_producer_stopped_at_a_gap_fails_the_parcel_for_a_replay_one_by_one():
    """librdkafka stopped the producer at a refused record batch (the forced gapless guarantee)
    and produce() refuses with _FATAL before poll() raised the gap: the publisher learns the gap,
    the messages not handed over fail with it, and the parcel is replayed one message per
    request (not restarted as a fatal error, which would meet the same batch again)."""
    from relay.core.errors import BatchRefusedError
    from relay.core.message import OutgoingMessage
    from relay.core.window import Parcel
    from relay.kafka.producer import IdempotentPublisher

    gap = KafkaError(KafkaError._GAPLESS_GUARANTEE, "refused batch: unable to satisfy gap-less guarantee", fatal=True)

    class StoppedProducer:
        handed = 0
        raised = False

        def produce(self, *args, on_delivery, **kwargs):
            if self.handed:
                raise KafkaException(KafkaError(KafkaError._FATAL))
            self.handed += 1

        def poll(self, timeout):
            if not self.raised:
                self.raised = True
                raise KafkaException(gap)
            return 0

        def purge(self, **kwargs):
            pass

    class Stopped(IdempotentPublisher):
        def _produce_all(self, parcel, while_waiting):
            self._producer = StoppedProducer()
            super()._produce_all(parcel, while_waiting)

    publisher = Stopped({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": "1000"})
    real = publisher._producer
    messages = [OutgoingMessage(f"e{i}", "orders", b"k", f"v{i}".encode(), []) for i in range(3)]
    parcel = Parcel([1, 2, 3], messages, None, 0.0)
    publisher.send(parcel, lambda: None)
    assert parcel.pending == 1 and parcel.failure == (b"", gap), "two never handed over, one awaits its report"
    refused = publisher.failure(parcel)
    assert isinstance(refused, BatchRefusedError) and refused.events == 3, refused
    real.purge()


def test_a_permission_refusal_stop_line_lists_each_refused_action_and_resource():
    from relay.core.errors import PermissionDeniedError
    from relay.ops.observe import write_stop_line
    from tests.support.logs import captured_logs

    refused = [("changeStream", "shop.outbox"), ("CREATE (TOPIC_AUTHORIZATION_FAILED)", "TOPIC relay.offsets")]
    with captured_logs("json") as capture:
        write_stop_line(PermissionDeniedError.missing("MongoDB", "relay@admin", refused))
    [line] = capture.lines()
    assert line["error_kind"] == "PermissionDeniedError" and line["exit_code"] == 2
    assert line["refused"] == [{"action": "changeStream", "resource": "shop.outbox"},
                               {"action": "CREATE (TOPIC_AUTHORIZATION_FAILED)", "resource": "TOPIC relay.offsets"}]
    with captured_logs("json") as capture:
        write_stop_line(ConfigError("RELAY_X", "bad"))
    assert "refused" not in capture.lines()[0]


def test_the_text_stop_line_says_its_kind_event_and_reason_once():
    """A terminal's stop line: the message names the kind, the event and the reason; the fields
    after it add only what it does not say (the exit code, the cause). JSON keeps every field."""
    from relay.core.errors import PoisonEventError
    from relay.ops.observe import write_stop_line
    from tests.support.logs import captured_logs

    def stop() -> None:
        try:
            raise ValueError("boom")
        except ValueError as exc:
            try:
                raise PoisonEventError("e-1", "payload field missing") from exc
            except PoisonEventError as poison:
                write_stop_line(poison)

    with captured_logs("text") as capture:
        stop()
    [line] = capture.text.splitlines()
    assert ("ERROR relay stopping on PoisonEventError: poison event e-1: payload field missing"
            "  exit_code=4 cause=ValueError: boom") in line, line
    assert line.count("payload field missing") == 1 and line.count("e-1") == 1
    with captured_logs("json") as capture:
        stop()
    [fields] = capture.lines()
    assert (fields["error_kind"], fields["event_id"], fields["reason"]) == (
        "PoisonEventError", "e-1", "payload field missing")

"""Token arithmetic, pipeline fingerprints and the error classifier (pure logic)."""

from __future__ import annotations

from bson import Timestamp
from confluent_kafka import KafkaError, KafkaException
from pymongo.errors import AutoReconnect, OperationFailure, WriteConcernError

from relay.changes import PIPELINE, pipeline_fingerprint, token_cluster_time
from relay.errors import (
    Action, BatchRefusedError, ConfigError, DeliveryError, LeaseLostError, PoisonEventError, ReopenableStreamError,
    HistoryLostError, classify, translate_mongo,
)


def test_token_cluster_time_reads_the_keystring_timestamp():
    assert token_cluster_time({"_data": "826B02209A000000042B0229296E04"}) == Timestamp(0x6B02209A, 4)
    assert token_cluster_time({"_data": "not-a-token"}) is None
    assert token_cluster_time(None) is None


def test_pipeline_fingerprint_depends_on_namespace_and_pipeline():
    base = pipeline_fingerprint("app.outbox")
    assert base == pipeline_fingerprint("app.outbox", PIPELINE)
    assert base != pipeline_fingerprint("app.other")
    assert base != pipeline_fingerprint("app.outbox", [{"$match": {"operationType": "insert"}}])


def test_classifier_restarts_on_transient_and_stops_on_what_an_operator_must_fix():
    assert classify(DeliveryError("e1", "timed out")) is Action.RESTART
    assert classify(AutoReconnect("connection closed")) is Action.RESTART
    assert classify(WriteConcernError("waiting for replication timed out", 64, {})) is Action.RESTART
    assert classify(KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))) is Action.RESTART
    assert classify(OperationFailure("stepped down", 189)) is Action.RESTART
    assert classify(LeaseLostError("lost")) is Action.STANDBY
    assert classify(PoisonEventError("e1", "bad")) is Action.POISON
    assert classify(BatchRefusedError("refused", 3)) is Action.POISON
    assert classify(HistoryLostError("gone")) is Action.STOP
    assert classify(ConfigError("RELAY_X", "bad")) is Action.STOP
    assert classify(OperationFailure("unauthorized", 13)) is Action.STOP
    assert classify(ValueError("bug")) is Action.STOP


def test_history_lost_and_reopenable_codes_are_translated():
    assert isinstance(translate_mongo(OperationFailure("gone", 286)), HistoryLostError)
    err = translate_mongo(OperationFailure("fatal", 280))
    assert isinstance(err, ReopenableStreamError) and err.code == 280
    assert classify(err) is Action.REOPEN


def test_kraft_cluster_ids_never_start_with_a_dash():
    from relay.devstack import _cluster_id

    ids = [_cluster_id() for _ in range(2000)]  # about 31 of 2,000 raw ids start with "-"
    assert all(not i.startswith("-") and len(i) == 22 for i in ids)

"""Server errors by name (issue 42): how a driver's error reads on a log line, a stop line and
at the command line's exit, without a server (the failpoint tests in
tests/faults/test_server_errors.py show the same against a real mongod)."""

from __future__ import annotations

import json
import logging

import bson
from bson.raw_bson import RawBSONDocument
from confluent_kafka import KafkaError, KafkaException
from pymongo.errors import NotPrimaryError, OperationFailure

from relay.core.errors import EXIT_SERVER, ServerError, ServerRefusedError
from relay.kafka import errors as kafka_errors
from relay.mongo import errors as mongo_errors
from relay.mongo.commands import command_name
from relay.ops.exits import run_command
from relay.ops.observe import write_stop_line
from tests.support.logs import captured_logs


def _bad_value() -> OperationFailure:
    reply = RawBSONDocument(bson.encode({"ok": 0.0, "errmsg": "no such thing", "code": 2, "codeName": "BadValue"}))
    return OperationFailure("no such thing", 2, reply)


def test_a_server_error_is_named_by_code_name_code_and_message_never_its_raw_reply():
    exc = _bad_value()
    assert "RawBSONDocument" in str(exc), "pymongo's own text carries the raw reply"
    assert mongo_errors.describe(exc) == "MongoDB: BadValue (2): no such thing"
    shut = NotPrimaryError("x, full error: {...}", {"code": 91, "codeName": "ShutdownInProgress", "errmsg": "going"})
    assert mongo_errors.describe(shut) == "MongoDB: ShutdownInProgress (91): going"


def test_an_unexpected_server_error_is_a_refusal_that_stops_with_exit_5_and_a_transient_one_restarts():
    refused = mongo_errors.translate(_bad_value())
    assert isinstance(refused, ServerRefusedError) and refused.exit_code == EXIT_SERVER
    assert isinstance(refused.__cause__, OperationFailure)
    transient = mongo_errors.relay_error(OperationFailure("stepping down", 189))
    assert isinstance(transient, ServerError) and "PrimarySteppedDown (189): stepping down" in str(transient)


def test_commands_are_named_for_what_the_relay_was_doing():
    stream = [{"$changeStream": {}}, {"$match": {}}]
    assert command_name("aggregate", "shop", {"aggregate": 1, "pipeline": stream}, {}) == \
        "aggregate opening the change stream of shop"
    assert command_name("getMore", "shop", {"getMore": 7, "collection": "$cmd.aggregate"}, {7: "shop"}) == \
        "getMore on the change stream of shop"
    assert command_name("update", "shop", {"update": "outbox_relay_leases"}, {}) == "update on shop.outbox_relay_leases"


def test_librdkafka_errors_are_named_by_name_code_and_message():
    err = KafkaError(KafkaError._MSG_TIMED_OUT)
    assert kafka_errors.describe(err) == "_MSG_TIMED_OUT (-192): Local: Message timed out"
    assert kafka_errors.describe(KafkaException(err)) == kafka_errors.describe(err)
    assert "KafkaError{" not in str(kafka_errors.relay_error(KafkaException(err)))


def test_the_stop_line_of_a_server_error_has_no_traceback_unless_at_debug():
    for level, traceback in (("INFO", False), ("DEBUG", True)):
        with captured_logs(level=level) as logs:
            write_stop_line(_bad_value())
        (stop,) = logs.errors()
        assert stop["error_kind"] == "ServerRefusedError" and stop["exit_code"] == EXIT_SERVER
        assert stop["message"] == "stopping on ServerRefusedError: MongoDB: BadValue (2): no such thing"
        assert ("exc" in stop) is traceback
        assert "RawBSONDocument" not in json.dumps(stop["message"])


def test_any_log_line_shows_a_driver_error_by_name_and_no_raw_reply():
    exc = _bad_value()
    with captured_logs() as logs:
        logging.getLogger("relay.test").warning("failed: %s", exc, extra={"cause": str(exc)})
    (line,) = logs.lines()
    assert line["message"] == "failed: MongoDB: BadValue (2): no such thing"
    assert line["cause"] == "no such thing"
    assert "RawBSONDocument" not in logs.text and "\\\\x" not in logs.text


def test_a_librdkafka_error_handed_to_a_log_line_is_named_not_dumped():
    with captured_logs() as logs:
        logging.getLogger("relay.test").warning("consumer error: %s", KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    (line,) = logs.lines()
    assert line["message"].startswith("consumer error: UNKNOWN_TOPIC_OR_PART (3): ")
    assert "KafkaError{" not in logs.text


def test_a_handlers_server_error_is_named_in_the_inbox_poison_reason():
    from relay.inbox.errors import HandlerError

    reason = str(HandlerError(None, _bad_value()))  # type: ignore[arg-type]
    assert reason == "handler raised OperationFailure: MongoDB: BadValue (2): no such thing"


def test_a_command_ending_on_a_server_error_exits_5_with_one_line(capsys):
    def command() -> int:
        raise _bad_value()

    assert run_command("outbox-relay", command) == EXIT_SERVER
    err = capsys.readouterr().err
    assert err == "outbox-relay: ServerRefusedError: MongoDB: BadValue (2): no such thing\n"

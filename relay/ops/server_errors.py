"""A driver's exception in the relay's terms, wherever one reaches a log line, a stop or an exit.

The driver layers translate what they recognise where they catch it; an exception that still
reaches the loop's outcome, a stop line or the command line as pymongo's or confluent-kafka's own
goes through `as_relay_error` once: the relay error it amounts to (relay.mongo.errors.relay_error,
relay.kafka.errors.relay_error), carrying the driver's exception as its cause. So every line names
a server error as `CodeName (code): message` with what was being done, never the server's raw
reply, and an unexpected server error stops with ServerRefusedError's exit code (5).
"""

from __future__ import annotations

import weakref

from confluent_kafka import KafkaError, KafkaException
from pymongo.errors import PyMongoError

from relay.kafka import errors as kafka_errors
from relay.mongo import errors as mongo_errors

# One translation per driver exception, so that the stop line and the command line's exit see the
# same relay error (its `logged` flag says the stop line was written).
_translated: weakref.WeakKeyDictionary[BaseException, BaseException] = weakref.WeakKeyDictionary()


def as_relay_error(exc: BaseException) -> BaseException:
    """The relay error a driver's exception amounts to, with `exc` as its cause (the same object
    every time for one exception); any other exception (a relay error included) as it is."""
    if not isinstance(exc, (PyMongoError, KafkaException)):
        return exc
    known = _translated.get(exc)
    if known is not None:
        return known
    if isinstance(exc, PyMongoError):
        translated: BaseException = mongo_errors.relay_error(exc)
    else:
        translated = kafka_errors.relay_error(exc)
    translated.__cause__ = exc
    _translated[exc] = translated
    return translated


def error_text(exc: BaseException) -> str:
    """One line for any exception: a driver's as the relay error it amounts to, else `str`."""
    return str(as_relay_error(exc))


def logged_value(value: object) -> object:
    """A log call's argument as a line shows it: an exception by `error_text`, a librdkafka
    `KafkaError` (handed over by a callback, not raised) as `NAME (code): message`; else as is."""
    if isinstance(value, BaseException):
        return error_text(value)
    if isinstance(value, KafkaError):
        return kafka_errors.describe(value)
    return value

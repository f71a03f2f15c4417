"""One error tree, the MongoDB error-code table, and the one classifier the loop consults.

The loop never inspects exceptions itself: `classify()` maps any exception to an `Action`, and
the loop's outcome table (`relay.relay.Relay._outcome`) says what each action does:
- RESTART: drop the producer and the change stream, back off, reopen from the stored
  checkpoint (delivery errors, fatal producer errors, lost connections, elections);
- REOPEN: the same, for a non-resumable change stream error a fresh cursor may not hit again;
  if the same code repeats without progress the relay stops (RepeatedStreamError);
- POISON: an event cannot be published (or the broker refused a record batch); the poison
  policy (`relay.poison.PoisonPolicy`) decides: stop at the event, dead-letter it, or replay
  the batch one message per request to find it;
- STANDBY: the lease was lost (a fenced MongoDB write, or in exactly-once mode the broker fenced
  the transactional producer); stop publishing and go back to standby;
- STOP: an operator must act (bad configuration, history lost, invalidated stream, pipeline
  changed); the relay exits with the error's `exit_code`.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
from typing import Any

# MongoDB server error codes the relay treats specially, with their names.
MONGO_ERROR_NAMES: dict[int, str] = {
    136: "CappedPositionLost",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    11000: "DuplicateKey",
}
DUPLICATE_KEY = 11000  # an upsert lost a race on _id (relay.spark.state's conditional upserts)
HISTORY_LOST_CODES = frozenset({286})
# Server errors a later attempt can succeed after (elections, shutdowns, interruptions,
# failed writes that the failCommand failpoint also injects).
TRANSIENT_CODES = frozenset({6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
                             64, 100, 112, 117, 133, 134, 150, 234})
# Not resumable by the driver, but a fresh cursor from the stored token may succeed;
# if the same code repeats without progress the relay stops (see relay.Relay).
REOPENABLE_CODES = frozenset({136, 280})

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
EXIT_DATA = 4


class Action(enum.Enum):
    RESTART = "restart"
    REOPEN = "reopen"
    POISON = "poison"
    STANDBY = "standby"
    STOP = "stop"


class RelayError(Exception):
    """Base of every error the relay raises on purpose."""

    exit_code = EXIT_FATAL
    # Set once the error was written to the relay's log as its stop line, so the command line
    # does not print it a second time.
    logged = False


class ConfigError(RelayError):
    """Raised when a setting is missing, malformed or conflicting; names the setting."""

    exit_code = EXIT_CONFIG

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


class DevStackError(RelayError):
    """Raised when a local server (mongod, Kafka) cannot be prepared or started."""


class ServerUnreachableError(RelayError):
    """Raised when MongoDB or Kafka cannot be reached within the connect timeout."""

    exit_code = EXIT_UNREACHABLE


class TransientError(RelayError):
    """Raised when a step failed in a way a restart from the checkpoint can fix."""


class DeliveryError(TransientError):
    """Raised when Kafka reported a failed delivery for an event of the current batch."""

    def __init__(self, event_id: str, error: Any) -> None:
        super().__init__(f"delivery of event {event_id} failed: {error}")
        self.event_id = event_id
        self.error = error


class BatchRefusedError(TransientError):
    """Raised when the broker refused a record batch for good (e.g. too large for the topic):
    the batch is replayed one message per request to find the event responsible."""

    def __init__(self, message: str, events: int) -> None:
        super().__init__(message)
        self.events = events  # how many events the refused batch held


class ProducerFatalError(TransientError):
    """Raised when the producer instance is unusable (librdkafka fatal error)."""


class ReopenableStreamError(TransientError):
    """Raised when the change stream failed with a code a fresh cursor may not hit again."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"change stream error {code} ({MONGO_ERROR_NAMES.get(code, '?')}): {message}")
        self.code = code


class LeaseHeldError(RelayError):
    """Raised when an operator action needs the lease to be free (e.g. `checkpoint reset`) and
    another replica holds it; names the holder."""

    exit_code = EXIT_CONFIG


class LeaseLostError(RelayError):
    """Raised when a fenced write matched nothing: another replica holds the lease."""


class ProducerFencedError(LeaseLostError):
    """Raised when the broker fenced this relay's transactional producer (exactly-once mode): a
    newer producer with the same `transactional.id` (a new leader of the lease) initialized its
    transactions, so nothing this producer sends can be committed any more."""


class TransactionAbortedError(TransientError):
    """Raised when a Kafka transaction failed in a way that aborting it cures (exactly-once mode):
    it was aborted, so none of its messages is visible to read_committed consumers, and the relay
    restarts from its resume point."""


class StopError(RelayError):
    """Base for conditions an operator must resolve; the relay exits with EXIT_DATA."""

    exit_code = EXIT_DATA


class PoisonEventError(StopError):
    """Raised when an outbox event cannot be published (malformed, not encodable, too large)."""

    def __init__(self, event_id: str, reason: str) -> None:
        super().__init__(f"poison event {event_id}: {reason}")
        self.event_id = event_id
        self.reason = reason


class HistoryLostError(StopError):
    """Raised when the stored checkpoint is no longer in the oplog (ChangeStreamHistoryLost)."""


class StreamInvalidatedError(StopError):
    """Raised when the outbox collection was dropped or renamed under the change stream."""


class PipelineMismatchError(StopError):
    """Raised when the stored token was produced by a different change stream pipeline."""


class RepeatedStreamError(StopError):
    """Raised when a reopenable change stream error repeats without any progress."""


class OffsetsRecordError(StopError):
    """Raised when the offsets topic holds a record under this lease's key that the relay cannot
    read (not written by the relay, or for another lease); names the topic, partition and offset."""


class SchemaRegistryUnavailableError(TransientError):
    """Raised when the Schema Registry cannot be reached or answers with a transient error."""


class SchemaRegistryRefusedError(StopError):
    """Raised when the Schema Registry refuses a writer schema (incompatible, unregistered,
    unauthorized); names the subject and the schema."""


def run_command(prog: str, command: Callable[[], int]) -> int:
    """Run a command, turning the relay's errors into their exit codes with a one-line message
    on stderr (no traceback), and Ctrl-C into 130."""
    try:
        return command()
    except RelayError as exc:
        if not exc.logged:
            print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def classify(exc: BaseException) -> Action:
    """Decide what the loop does with an exception; the only place that inspects errors."""
    from pymongo.errors import (
        ConnectionFailure, NotPrimaryError, OperationFailure, PyMongoError, WriteConcernError,
    )

    if isinstance(exc, LeaseLostError):
        return Action.STANDBY
    if isinstance(exc, (PoisonEventError, BatchRefusedError)):
        return Action.POISON
    if isinstance(exc, ReopenableStreamError):
        return Action.REOPEN
    if isinstance(exc, TransientError):
        return Action.RESTART
    if isinstance(exc, RelayError):
        return Action.STOP
    if isinstance(exc, (ConnectionFailure, WriteConcernError, NotPrimaryError)):
        # Network errors, elections, timeouts, write concern errors: a fresh start from the
        # stored checkpoint is always safe, since nothing moves until a fenced write succeeds.
        return Action.RESTART
    if isinstance(exc, OperationFailure):
        transient = exc.has_error_label("RetryableWriteError") or exc.has_error_label(
            "ResumableChangeStreamError") or exc.code in TRANSIENT_CODES
        return Action.RESTART if transient else Action.STOP
    if isinstance(exc, PyMongoError):
        return Action.RESTART
    from confluent_kafka import KafkaException

    if isinstance(exc, KafkaException):
        # A producer error that escaped its boundary's translation: a fenced transactional
        # producer means a newer leader took over; abortable and fatal ones are cured by a new
        # producer and a restart from the resume point.
        return Action.STANDBY if kafka_fenced(exc.args[0] if exc.args else None) else Action.RESTART
    return Action.STOP


def kafka_fenced(err: Any) -> bool:
    """Whether a confluent-kafka `KafkaError` says a newer producer with the same transactional.id
    fenced this one (librdkafka raises `_FENCED`; the broker answers PRODUCER_FENCED or, before
    KIP-588, INVALID_PRODUCER_EPOCH)."""
    from confluent_kafka import KafkaError

    fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    return isinstance(err, KafkaError) and err.code() in fenced


def translate_mongo(exc: BaseException) -> BaseException:
    """Turn the MongoDB errors with a meaning of their own into the relay's errors."""
    from pymongo.errors import OperationFailure

    if isinstance(exc, OperationFailure):
        if exc.code in HISTORY_LOST_CODES:
            return HistoryLostError(
                "the stored checkpoint is no longer in the oplog (ChangeStreamHistoryLost): "
                "events between it and the oldest oplog entry cannot be read from the change "
                "stream; see the README runbook 'history lost'"
            )
        if exc.code in REOPENABLE_CODES:
            return ReopenableStreamError(int(exc.code), str(exc))
    return exc

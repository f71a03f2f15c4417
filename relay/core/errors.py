"""One error tree, rooted at `RelayError`; every kind carries the action the loop takes for it.

The loop never inspects exceptions itself: it asks `classify()` for an `Action` (RESTART, REOPEN,
POISON, FENCED, STOP), and its outcome table, in relay.core.loop's docstring, says what each one
does. The action is a class attribute of each kind, never derived from where a class sits in the
tree. The drivers' exceptions are classified by the driver layers (`relay.mongo.errors.action_for`,
`relay.kafka.errors.action_for`), which the wiring hands to the loop; an exception nobody
recognises stops the relay (exit 1). Errors raised while translating a driver's exception keep it
as their cause (`raise ... from exc`): the stop line logs it. This module imports no driver.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import ClassVar

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
EXIT_DATA = 4
EXIT_SERVER = 5


class Action(enum.Enum):
    """What the loop does after an error ended a pass (the table in relay.core.loop's docstring)."""

    RESTART = "restart"
    REOPEN = "reopen"
    POISON = "poison"
    FENCED = "fenced"
    STOP = "stop"


class RelayError(Exception):
    """Base of every error the relay raises on purpose."""

    action: ClassVar[Action] = Action.STOP
    exit_code: ClassVar[int] = EXIT_FATAL
    # Set once the error was written to the relay's log as its stop line, so the command line
    # does not print it a second time.
    logged = False


# ---- start-up and operator errors: stop ---------------------------------------------------------


class ConfigError(RelayError):
    """Raised when a setting is missing, malformed or conflicting; names the setting."""

    action = Action.STOP
    exit_code = EXIT_CONFIG

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


class ServerUnreachableError(RelayError):
    """Raised when MongoDB or Kafka cannot be reached within the connect timeout."""

    action = Action.STOP
    exit_code = EXIT_UNREACHABLE


class PermissionDeniedError(RelayError):
    """Raised when MongoDB or Kafka refuses the relay's user an action it needs; names each
    action and the namespace, topic or resource it was refused on (docs/security.md lists what
    to grant; `outbox-relay security role` prints MongoDB's)."""

    action = Action.STOP
    exit_code = EXIT_CONFIG

    def __init__(self, message: str, refused: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.refused = refused  # (action or operation, namespace or resource)
        self.reason = message

    @classmethod
    def missing(
        cls, server: str, principal: str, refused: list[tuple[str, str]], hint: str = "docs/security.md"
    ) -> PermissionDeniedError:
        listed = "; ".join(f"{action} on {resource}" for action, resource in refused)
        return cls(f"{server} does not allow {principal} {listed} (grant them: {hint})", refused)


class LeaseHeldError(RelayError):
    """Raised when an operator action needs the lease to be free (e.g. `checkpoint reset`) and
    another replica holds it; names the holder."""

    action = Action.STOP
    exit_code = EXIT_CONFIG


class OperatorActionError(RelayError):
    """Base for conditions in the data an operator must resolve; the relay exits with EXIT_DATA."""

    action = Action.STOP
    exit_code = EXIT_DATA


HISTORY_LOST_RUNBOOK = "see the README runbook 'history lost'"


class HistoryLostError(OperatorActionError):
    """Raised when the point a change stream was to start at is no longer in the oplog
    (ChangeStreamHistoryLost): the live relay's stored checkpoint, or the start of a replay's
    oplog part."""

    @classmethod
    def of(cls, start: str = "the stored checkpoint", then: str = HISTORY_LOST_RUNBOOK) -> HistoryLostError:
        """The one history-lost message: `start` (what the stream was to start at) is gone, and
        `then` what to do."""
        return cls(
            f"{start} is no longer in the oplog (ChangeStreamHistoryLost): events between it and the oldest "
            f"oplog entry cannot be read from the change stream; {then}"
        )


class StreamInvalidatedError(OperatorActionError):
    """Raised when the outbox collection was dropped or renamed under the change stream."""


class PipelineMismatchError(OperatorActionError):
    """Raised when the stored token was produced by a different change stream pipeline."""

    @classmethod
    def between(cls, stored_in: str, stored: str | None, now: str) -> PipelineMismatchError:
        """The error for a checkpoint stored in `stored_in` by the pipeline `stored`, now `now`."""
        return cls(
            f"{stored_in} was made by a different change stream pipeline (fingerprint {stored}, now {now}); "
            "resuming could skip or repeat events. Reset the checkpoint (`outbox-relay checkpoint reset`) "
            "and set RELAY_START_AT to continue"
        )


class RepeatedStreamError(OperatorActionError):
    """Raised when a reopenable change stream error repeats without any progress."""


class OffsetsRecordError(OperatorActionError):
    """Raised when the offsets topic holds a record under this lease's key that the relay cannot
    read (not written by the relay, or for another lease); names the topic, partition and offset."""


class SchemaRegistryRefusedError(OperatorActionError):
    """Raised when the Schema Registry refuses a writer schema (incompatible, unregistered,
    unauthorized); names the subject and the schema."""


# ---- transient errors: restart from the checkpoint ----------------------------------------------


class TransientError(RelayError):
    """Raised when a step failed in a way a restart from the checkpoint can fix."""

    action = Action.RESTART


class ServerError(TransientError):
    """Raised when MongoDB or Kafka failed a request in a way a later attempt can succeed after
    (a lost connection, an election, a timeout); the driver's error is its cause."""


class ServerRefusedError(RelayError):
    """Raised when MongoDB or Kafka refused a request with an error the relay does not expect
    (neither transient nor with a meaning of its own, e.g. BadValue): names the server's code
    name, code and message and what the relay was doing; the relay stops (exit 5)."""

    action = Action.STOP
    exit_code = EXIT_SERVER


class DeliveryError(TransientError):
    """Raised when Kafka reported a failed delivery for an event of the current batch."""

    def __init__(self, event_id: str, error: object) -> None:
        super().__init__(f"delivery of event {event_id} failed: {error}")
        self.event_id = event_id
        self.error = error


class ProducerFatalError(TransientError):
    """Raised when the producer instance is unusable (librdkafka fatal error)."""


class TransactionAbortedError(TransientError):
    """Raised when a Kafka transaction failed in a way that aborting it cures (exactly-once mode):
    it was aborted, so none of its messages is visible to read_committed consumers, and the relay
    restarts from its resume point."""


class LeaseUnrenewedError(TransientError):
    """Raised when a leader's lease writes kept failing until the lease is about to expire (by the
    server's clock, less a margin): the session stops publishing before another replica may take
    the lease, and the loop restarts from its stored checkpoint."""


class SchemaRegistryUnavailableError(TransientError):
    """Raised when the Schema Registry cannot be reached or answers with a transient error."""


class ReopenableStreamError(RelayError):
    """Raised when the change stream failed with a code a fresh cursor may not hit again."""

    action = Action.REOPEN

    def __init__(self, code: int, name: str, message: str, doing: str = "the change stream") -> None:
        super().__init__(f"{doing}: {name} ({code}): {message}")
        self.code = code


# ---- events that cannot be published: the poison policy decides ------------------------------


class PoisonEventError(RelayError):
    """Raised when an outbox event cannot be published (malformed, not encodable, too large)."""

    action = Action.POISON
    exit_code = EXIT_DATA

    def __init__(self, event_id: str, reason: str) -> None:
        super().__init__(f"poison event {event_id}: {reason}")
        self.event_id = event_id
        self.reason = reason


class BatchRefusedError(RelayError):
    """Raised when the broker refused a record batch for good (e.g. too large for the topic):
    the batch is replayed one message per request to find the event responsible."""

    action = Action.POISON

    def __init__(self, message: str, events: int) -> None:
        super().__init__(message)
        self.events = events  # how many events the refused batch held


# ---- the lease was lost: back to standby ------------------------------------------------------


class LeaseLostError(RelayError):
    """Raised when a fenced write matched nothing: another replica holds the lease."""

    action = Action.FENCED


class ProducerFencedError(LeaseLostError):
    """Raised when the broker fenced this relay's transactional producer (exactly-once mode): a
    newer producer with the same `transactional.id` (a new leader of the lease) initialized its
    transactions, so nothing this producer sends can be committed any more."""


# ---- classification ---------------------------------------------------------------------------

ForeignClassifier = Callable[[BaseException], "Action | None"]


def classify(exc: BaseException, foreign: ForeignClassifier | None = None) -> Action:
    """The action for an exception: a relay error's own; for any other, what `foreign` (the
    driver layers' classifiers, passed by the wiring) says; STOP when nobody recognises it."""
    if isinstance(exc, RelayError):
        return exc.action
    action = foreign(exc) if foreign is not None else None
    return Action.STOP if action is None else action


def first_of(*classifiers: ForeignClassifier) -> ForeignClassifier:
    """One classifier asking each of `classifiers` in turn; the first answer wins."""

    def classify_foreign(exc: BaseException) -> Action | None:
        for c in classifiers:
            action = c(exc)
            if action is not None:
                return action
        return None

    return classify_foreign


_CAUSE_CHARS = 200


def cause_of(exc: BaseException) -> str | None:
    """The error that caused `exc` (its `__cause__`), for the stop line: `module.Kind: message`,
    or only its kind when the message is longer than a line (a driver's dump, e.g. pymongo's
    topology description: the relay's own message already says what matters in it)."""
    cause = exc.__cause__
    if cause is None:
        return None
    kind = type(cause).__qualname__
    module = type(cause).__module__
    if module != "builtins":
        kind = f"{module}.{kind}"
    text = str(cause)
    return kind if len(text) > _CAUSE_CHARS or "\n" in text else f"{kind}: {text}"

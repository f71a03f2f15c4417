"""The inbox's one classifier: which failures retry the batch, which make an event poison.

`retryable(exc)` is the only place that decides. Retried (the batch is run again, the same events
in the same order, nothing of it committed to Kafka until it succeeds):

- MongoDB errors a later attempt can succeed after: what pymongo labels transient in a
  transaction (TransientTransactionError, UnknownTransactionCommitResult), lost connections and
  elections (ConnectionFailure, NotPrimaryError), timeouts (`PyMongoError.timeout`), write
  concern errors, and server errors with a transient code or label
  (relay.mongo.errors.action_for);
- a Schema Registry that cannot be asked (SchemaRegistryUnavailableError: a network error, a
  timeout, 408/429/5xx; relay.avro.framing.decode_failure).

Anything else is not retried. Raised by the handler, it makes the handler's event poison
(HandlerError names its event): also a PyMongoError that no later attempt can fix
(InvalidOperation or ConfigurationError from a wrong or ended session, a duplicate key, a refused
command). Raised by the inbox's own work, it ends `run` (no replica set, a missing privilege, a
registry that refuses the inbox's credentials).
"""

from __future__ import annotations

from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError, WriteConcernError

from relay.core.errors import Action, SchemaRegistryUnavailableError
from relay.inbox.event import InboxEvent
from relay.mongo.errors import action_for
from relay.ops.server_errors import logged_value

TRANSACTION_LABELS = ("TransientTransactionError", "UnknownTransactionCommitResult")


def retryable(exc: BaseException) -> bool:
    """Whether a later attempt at the batch can succeed after `exc` (the module docstring)."""
    if isinstance(exc, SchemaRegistryUnavailableError):
        return True
    if not isinstance(exc, PyMongoError):
        return False
    if any(exc.has_error_label(label) for label in TRANSACTION_LABELS):
        return True
    if isinstance(exc, (ConnectionFailure, WriteConcernError)) or exc.timeout:
        return True
    return isinstance(exc, OperationFailure) and action_for(exc) is Action.RESTART


class HandlerError(Exception):
    """Raised when the handler raised for `event` (the batch's transaction was aborted): the
    event is poison (relay.inbox.poison)."""

    def __init__(self, event: InboxEvent, cause: BaseException) -> None:
        # A driver's error by name (`BadValue (2): ...`), never pymongo's raw reply: the text is
        # the poison reason, on the stop line and in the dead letter's header.
        super().__init__(f"handler raised {type(cause).__name__}: {logged_value(cause)}")
        self.event = event
        self.cause = cause

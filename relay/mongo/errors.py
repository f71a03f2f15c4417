"""MongoDB's errors in the relay's terms: the code table, which are resumable, and what the loop
does with the rest.

- `resumable()` is the change streams spec's rule (Resume Process): a network error, a cursor
  the server no longer has (CursorNotFound), or an error the server labels
  `ResumableChangeStreamError` (MongoDB 4.4 and later label every resumable error). The change
  source resumes once on those, from its own last token, invisibly.
- `translate()` turns the codes with a meaning of their own into relay errors: history lost
  (stop, or rescan when the operator chose it), and the codes a fresh cursor may not hit again
  (reopen).
- `action_for()` is what the loop does with any other pymongo error (the wiring hands it to the
  loop's classifier): restart for everything a later attempt can succeed after (network errors,
  elections, timeouts, write concern errors, transient codes), stop otherwise.
"""

from __future__ import annotations

import re

from pymongo.errors import (
    ConnectionFailure,
    CursorNotFound,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)

from relay.core.errors import Action, HistoryLostError, PermissionDeniedError, ReopenableStreamError

# The privilege action a refused command needs (MongoDB's "not authorized on <db> to execute
# command { <command>: <collection>, ... }").
_COMMAND_ACTIONS = {
    "find": "find",
    "getMore": "find",
    "count": "find",
    "aggregate": "find",
    "insert": "insert",
    "update": "update",
    "delete": "remove",
    "findAndModify": "find, update",
    "createIndexes": "createIndex",
    "listIndexes": "listIndexes",
}
_REFUSED = re.compile(r'not authorized on (?P<db>\S+) to execute command \{ (?P<command>\w+): (?P<target>"[^"]*"|\S+)')

# MongoDB server error codes the relay treats specially, by name (the server's error_codes.yml).
ERROR_NAMES: dict[int, str] = {
    6: "HostUnreachable",
    7: "HostNotFound",
    13: "Unauthorized",
    18: "AuthenticationFailed",
    43: "CursorNotFound",
    64: "WriteConcernFailed",
    89: "NetworkTimeout",
    91: "ShutdownInProgress",
    100: "UnsatisfiableWriteConcern",
    112: "WriteConflict",
    117: "ConflictingOperationInProgress",
    133: "FailedToSatisfyReadPreference",
    134: "ReadConcernMajorityNotAvailableYet",
    136: "CappedPositionLost",
    150: "StaleEpoch",
    189: "PrimarySteppedDown",
    234: "RetryChangeStream",
    262: "ExceededTimeLimit",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    9001: "SocketException",
    10107: "NotWritablePrimary",
    11000: "DuplicateKey",
    11600: "InterruptedAtShutdown",
    11602: "InterruptedDueToReplStateChange",
    13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
}
CODES: dict[str, int] = {name: code for code, name in ERROR_NAMES.items()}
CURSOR_NOT_FOUND = CODES["CursorNotFound"]
# Wrong user or password: a stop naming RELAY_MONGODB_URI (relay.mongo.connection).
AUTHENTICATION_FAILED = CODES["AuthenticationFailed"]
UNAUTHORIZED = CODES["Unauthorized"]  # the user lacks a privilege: PermissionDeniedError names the action and namespace
DUPLICATE_KEY = CODES["DuplicateKey"]  # an upsert lost a race on _id (relay.spark.state's upserts)
HISTORY_LOST_CODES = frozenset({CODES["ChangeStreamHistoryLost"]})
# Server errors a later attempt can succeed after (elections, shutdowns, interruptions,
# failed writes that the failCommand failpoint also injects).
TRANSIENT_CODES = frozenset(
    CODES[name]
    for name in (
        "HostUnreachable",
        "HostNotFound",
        "NetworkTimeout",
        "ShutdownInProgress",
        "PrimarySteppedDown",
        "ExceededTimeLimit",
        "SocketException",
        "NotWritablePrimary",
        "InterruptedAtShutdown",
        "InterruptedDueToReplStateChange",
        "NotPrimaryNoSecondaryOk",
        "NotPrimaryOrSecondary",
        "WriteConcernFailed",
        "UnsatisfiableWriteConcern",
        "WriteConflict",
        "ConflictingOperationInProgress",
        "FailedToSatisfyReadPreference",
        "ReadConcernMajorityNotAvailableYet",
        "StaleEpoch",
        "RetryChangeStream",
    )
)
# Not resumable, but a fresh cursor from the stored token may succeed; if the same code
# repeats without progress the relay stops (relay.core.loop).
REOPENABLE_CODES = frozenset({CODES["CappedPositionLost"], CODES["ChangeStreamFatalError"]})
RESUMABLE_LABEL = "ResumableChangeStreamError"


def resumable(exc: PyMongoError) -> bool:
    """Whether the change stream may resume after `exc` (change streams spec, Resume Process)."""
    if isinstance(exc, ConnectionFailure):  # network errors and timeouts
        return True
    if isinstance(exc, CursorNotFound):
        return True
    return isinstance(exc, OperationFailure) and (exc.has_error_label(RESUMABLE_LABEL) or exc.code == CURSOR_NOT_FOUND)


def translate(exc: PyMongoError) -> BaseException:
    """The relay error for a server error with a meaning of its own, else `exc` itself."""
    if isinstance(exc, OperationFailure):
        if exc.code == UNAUTHORIZED:
            return unauthorized(exc)
        if exc.code in HISTORY_LOST_CODES:
            return HistoryLostError(
                "the stored checkpoint is no longer in the oplog (ChangeStreamHistoryLost): "
                "events between it and the oldest oplog entry cannot be read from the change "
                "stream; see the README runbook 'history lost'"
            )
        if exc.code in REOPENABLE_CODES:
            code = int(exc.code)
            return ReopenableStreamError(code, ERROR_NAMES.get(code, "?"), str(exc))
    return exc


def unauthorized(exc: OperationFailure) -> PermissionDeniedError:
    """PermissionDeniedError naming the action and namespace MongoDB refused (code 13)."""
    text = str(exc)
    m = _REFUSED.search(text)
    if m is None:
        return PermissionDeniedError(f"MongoDB refused the relay's user (Unauthorized, code 13): {text}", [])
    command, target = m["command"], m["target"].strip('"')
    action = "changeStream" if "$changeStream" in text else _COMMAND_ACTIONS.get(command, command)
    namespace = f"{m['db']}.{target}" if m["target"].startswith('"') else m["db"]
    hint = "docs/security.md; outbox-relay security role prints the role"
    return PermissionDeniedError.missing("MongoDB", "the relay's user", [(action, namespace)], hint)


def action_for(exc: BaseException) -> Action | None:
    """What the loop does after a pymongo error (None for anything else)."""
    if isinstance(exc, (ConnectionFailure, WriteConcernError, NotPrimaryError)):
        # Network errors, elections, timeouts, write concern errors: a fresh start from the
        # stored checkpoint is always safe, since nothing moves until a fenced write succeeds.
        return Action.RESTART
    if isinstance(exc, OperationFailure):
        transient = (
            exc.has_error_label("RetryableWriteError")
            or exc.has_error_label(RESUMABLE_LABEL)
            or exc.code in TRANSIENT_CODES
        )
        return Action.RESTART if transient else Action.STOP
    if isinstance(exc, PyMongoError):
        return Action.RESTART
    return None

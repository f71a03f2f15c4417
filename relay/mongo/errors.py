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
- `describe()` is how any log line or stop line names a server error: `CodeName (code): message`
  with what the relay was doing (relay.mongo.commands), built from the reply's fields, never from
  `str(exc)`, which carries the whole reply (raw BSON bytes for a change stream's getMore).
  `relay_error()` is the relay error for any pymongo error: transient ones a ServerError
  (restart), unexpected ones a ServerRefusedError (stop, exit 5), each raised from the original.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pymongo.errors import (
    ConnectionFailure,
    CursorNotFound,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)

from relay.core.errors import (
    Action,
    HistoryLostError,
    PermissionDeniedError,
    RelayError,
    ReopenableStreamError,
    ServerError,
    ServerRefusedError,
)
from relay.mongo.commands import doing

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
    2: "BadValue",
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


_MESSAGE_CHARS = 300


def _parts(exc: OperationFailure | NotPrimaryError) -> tuple[str, int | None, str]:
    """The server's code name, code and message, read from the reply's fields (`codeName`,
    `code`, `errmsg`), never from `str(exc)` which appends the whole reply."""
    details = exc.details if isinstance(exc.details, Mapping) else {}
    own = exc.code if isinstance(exc, OperationFailure) else None
    code = own if own is not None else details.get("code")
    known = ERROR_NAMES.get(int(code), "UnknownError") if code is not None else "Error"
    message = details.get("errmsg") or _first_line(exc.args[0] if exc.args else "")
    return str(details.get("codeName") or known), code, str(message)


def describe(exc: BaseException) -> str:
    """A pymongo error in one line: `CodeName (code): message`, prefixed with what the relay was
    doing when it is known ("getMore on the change stream of shop: BadValue (2): ..."), else with
    "MongoDB"; never the server's whole reply. Other errors: `MongoDB: Kind: message` (its first
    line, at most 300 characters)."""
    replied = isinstance(exc, OperationFailure) or (isinstance(exc, NotPrimaryError) and exc.details)
    if not isinstance(exc, (OperationFailure, NotPrimaryError)) or not replied:
        return f"MongoDB: {type(exc).__name__}: {_first_line(str(exc))}"
    name, code, message = _parts(exc)
    text = f"{name} ({code}): {message}" if code is not None else f"{name}: {message}"
    labels = [label for label in (RESUMABLE_LABEL, "RetryableWriteError") if exc.has_error_label(label)]
    if labels:
        text += f" [{', '.join(labels)}]"
    return f"{doing(exc.details) or 'MongoDB'}: {text}"


def _first_line(text: object) -> str:
    line = str(text).partition(", full error: ")[0].partition("\n")[0]
    return line if len(line) <= _MESSAGE_CHARS else line[:_MESSAGE_CHARS] + "…"


def relay_error(exc: PyMongoError) -> RelayError:
    """The relay error for any pymongo error (raise it `from exc`): what `translate` says, else a
    ServerError (restart) naming it, for what a later attempt can succeed after."""
    translated = translate(exc)
    return translated if isinstance(translated, RelayError) else ServerError(describe(exc))


def translate(exc: PyMongoError) -> BaseException:
    """The relay error for a server error with a meaning of its own (refused privilege, history
    lost, reopenable codes); for any other error the loop would stop on (`action_for`), a
    ServerRefusedError naming it and what was being done (exit 5); else `exc` itself."""
    if isinstance(exc, OperationFailure):
        if exc.code == UNAUTHORIZED:
            return unauthorized(exc)
        if exc.code in HISTORY_LOST_CODES:
            return HistoryLostError.of()
        if exc.code in REOPENABLE_CODES:
            name, _, message = _parts(exc)
            return ReopenableStreamError(int(exc.code), name, message, doing(exc.details) or "the change stream")
        if action_for(exc) is Action.STOP:
            refused = ServerRefusedError(describe(exc))
            refused.__cause__ = exc  # kept even where the caller raises it later, unchained
            return refused
    return exc


def unauthorized(exc: OperationFailure) -> PermissionDeniedError:
    """PermissionDeniedError naming the action and namespace MongoDB refused (code 13)."""
    text = str(exc)
    m = _REFUSED.search(text)
    if m is None:
        return PermissionDeniedError(f"MongoDB refused the relay's user: {describe(exc)}", [])
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

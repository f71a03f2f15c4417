"""What the relay was doing when MongoDB refused a command, for the error's one line.

A pymongo `OperationFailure` carries the server's reply (its code, code name and message) but not
the command that failed. `CommandNames` is a command listener (pymongo.monitoring) on the relay's
client that names every command as it starts ("getMore on the change stream of shop", "update on
shop.relay_leases") and, when one fails, remembers that name beside the failure's reply (the very
object pymongo raises the error with, as its `details`). `doing(details)` gives it back for the
error whose `details` is that same object, and None for any other, so a name is never attached to
the wrong error, whichever thread logs it.

Bounded: a started command's name is kept until its success or failure; the last `_FAILURES`
failures; change stream cursor ids (to tell a change stream's getMore from a find's) at most
`_CURSORS` of them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pymongo import monitoring

_CURSORS = 1024
_FAILURES = 64


@dataclass(frozen=True)
class _Failure:
    doing: str
    reply: object


# The last failures, by the identity of the reply pymongo raises with (kept referenced here, so an
# id is not reused while it is listed); read from any thread: an error raised on the stream's
# reader thread is often logged on a relay loop's.
_failures: OrderedDict[int, _Failure] = OrderedDict()
_lock = threading.Lock()


def doing(details: object) -> str | None:
    """What the relay was doing when the server answered `details` (an error's reply), or None
    when that reply is not among the last `_FAILURES` failed commands' replies."""
    if details is None:
        return None
    with _lock:
        failure = _failures.get(id(details))
    return failure.doing if failure is not None and failure.reply is details else None


def command_name(name: str, database: str, command: Mapping[str, Any], streams: Mapping[Any, str]) -> str:
    """A command in words: `aggregate opening the change stream of shop`, `getMore on the change
    stream of shop.outbox`, `update on shop.relay_leases`; `streams` maps change stream cursor
    ids to what they watch."""
    target = command.get(name)
    if name == "aggregate":
        pipeline = command.get("pipeline") or []
        watched = database if target == 1 else f"{database}.{target}"
        if pipeline and isinstance(pipeline[0], Mapping) and "$changeStream" in pipeline[0]:
            return f"aggregate opening the change stream of {watched}"
        return f"aggregate on {watched}"
    if name == "getMore":
        stream = streams.get(target)
        if stream is not None:
            return f"getMore on the change stream of {stream}"
        collection = command.get("collection")
        return f"getMore on {database}.{collection}" if collection else f"getMore on {database}"
    return f"{name} on {database}.{target}" if isinstance(target, str) else f"{name} on {database}"


class CommandNames(monitoring.CommandListener):
    """Names the relay's commands so that a failure can say what was being done (module docstring)."""

    def __init__(self) -> None:
        self._started: dict[int, str] = {}
        self._streams: OrderedDict[Any, str] = OrderedDict()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name = command_name(event.command_name, event.database_name, event.command, self._streams)
        self._started[event.request_id] = name

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        name = self._started.pop(event.request_id, "")
        if name.startswith("aggregate opening the change stream of "):
            cursor = event.reply.get("cursor") if isinstance(event.reply, Mapping) else None
            if isinstance(cursor, Mapping) and cursor.get("id"):
                self._streams[cursor["id"]] = name.removeprefix("aggregate opening the change stream of ")
                while len(self._streams) > _CURSORS:
                    self._streams.popitem(last=False)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        name = self._started.pop(event.request_id, None)
        if name is not None:
            with _lock:
                _failures[id(event.failure)] = _Failure(name, event.failure)
                while len(_failures) > _FAILURES:
                    _failures.popitem(last=False)

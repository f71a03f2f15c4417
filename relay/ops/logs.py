"""Logging: JSON lines or text on stderr, with the relay loop's context on every line.

`RELAY_LOG_FORMAT=auto` (the default) writes JSON when stderr is not a terminal (containers,
files, pipes) and text on a terminal. A JSON line has `time` (UTC, ms), `level`, `logger`,
`message`, then every extra field of the record. Lines emitted on a relay loop thread carry the
loop's context (`instance`, `fencing`, `token`, and `partition` when the outbox is partitioned),
set by `relay.ops.observe.ScopeObserver` through `bind_loop_context`.

A driver's exception passed to a log call (`log.warning("... %s", exc)`) is written as the relay
error it amounts to (`relay.ops.server_errors`: `CodeName (code): message` with what was being
done), and any text field carrying pymongo's ", full error: <reply>" tail loses the tail: no
line shows the server's raw reply (BSON bytes), whoever logs it.

Both formats pass the whole line (message, fields, traceback, causes) through
`relay.core.redact.scrub`: URIs show `user:***@`, and the loaded settings' credential values
are masked wherever they appear, at every level.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import threading
from collections.abc import Mapping
from typing import IO, Any

from relay.core.redact import scrub
from relay.ops.config import LOG_FORMATS
from relay.ops.server_errors import logged_value

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "LoopContext",
    "ServerErrorText",
    "TextFormatter",
    "bind_loop_context",
    "resolve_log_format",
    "setup_logging",
]

# Attributes every LogRecord has; anything else on a record came from `extra` or a filter.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_TEXT_HIDDEN = frozenset({"instance", "summary"})  # in JSON only: noise on a terminal
# In text, left out when the message already says their value (a stop line names its kind, event
# and reason in its message: `stopping on PoisonEventError: poison event e-1: ...`); JSON keeps them.
_TEXT_SAID = frozenset({"error_kind", "event_id", "reason"})
_context = threading.local()


def bind_loop_context(fields: Mapping[str, Any]) -> None:
    """Make every log line emitted on this thread carry `fields` (the mapping is read live, so
    its owner updates it in place; fields a log call passes in `extra` win)."""
    _context.fields = fields


class LoopContext(logging.Filter):
    """Adds the loop context bound on the emitting thread (see `bind_loop_context`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields: Mapping[str, Any] | None = getattr(_context, "fields", None)
        if fields:
            d = record.__dict__
            for key, value in fields.items():
                if value is not None:
                    d.setdefault(key, value)
        return True


_FULL_ERROR = ", full error: "  # pymongo's OperationFailure text: "<errmsg>, full error: <the whole reply>"


def _without_reply(value: Any) -> Any:
    """A log argument or field as a line may show it: a driver's exception as the relay error it
    amounts to, a librdkafka error by name, a text without pymongo's raw reply tail; anything else
    as it is."""
    value = logged_value(value)
    if isinstance(value, str) and _FULL_ERROR in value:
        return value.partition(_FULL_ERROR)[0]
    return value


class ServerErrorText(logging.Filter):
    """Writes drivers' errors in the relay's words on every line (the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_without_reply(a) for a in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {k: _without_reply(v) for k, v in record.args.items()}
        record.msg = _without_reply(record.msg)
        d = record.__dict__
        for key in [k for k in d if k not in _RECORD_FIELDS and not k.startswith("_")]:
            d[key] = _without_reply(d[key])
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _RECORD_FIELDS and not k.startswith("_") and v is not None
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ms), level, logger, message, then every extra field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return scrub(json.dumps(out, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...` for people at a terminal; a field whose value
    the message already says (`_TEXT_SAID`) is not repeated."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        said = record.getMessage()
        fields = [
            f"{k}={v}"
            for k, v in _extras(record).items()
            if k not in _TEXT_HIDDEN and not (k in _TEXT_SAID and str(v) in said)
        ]
        if not fields:
            return scrub(line)
        head, sep, tail = line.partition("\n")  # keep a traceback below the fields
        return scrub(f"{head}  {' '.join(fields)}{sep}{tail}")


def resolve_log_format(fmt: str, stream: IO[str]) -> str:
    """`auto` is `text` on a terminal and `json` otherwise (containers, files, pipes)."""
    if fmt != "auto":
        return fmt
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


def _log_thread_crash(args: threading.ExceptHookArgs) -> None:
    """An exception that ended a thread: one ERROR line through the relay's formatter (so it is
    JSON in a container, and scrubbed of credentials) instead of a raw traceback on stderr."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("relay").error(
        "thread %s ended on %s",
        name,
        args.exc_type.__name__,
        exc_info=args.exc_value if args.exc_value is not None else True,
    )


def setup_logging(level: str = "INFO", fmt: str = "auto", stream: IO[str] | None = None) -> logging.Handler:
    """Log to stderr (or `stream`) as JSON lines or text (RELAY_LOG_FORMAT); returns the handler.

    Calling it again replaces the handler it installed before; other handlers stay. librdkafka's
    own lines (connection attempts), pika's (RabbitMQ's client: each connection step, each failed
    attempt, which the relay's error names once) and py4j's (Spark's Python bridge) show only at DEBUG. An
    exception that ends a thread is logged as an ERROR line too (`threading.excepthook`).
    """
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if resolve_log_format(fmt, stream) == "json" else TextFormatter())
    handler.addFilter(LoopContext())
    handler.addFilter(ServerErrorText())
    handler.outbox_relay = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "outbox_relay", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    threading.excepthook = _log_thread_crash
    debug = level.upper() == "DEBUG"
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("kafka.admin").setLevel(logging.CRITICAL)
    logging.getLogger("kafka.producer").setLevel(logging.DEBUG if debug else logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.DEBUG if debug else logging.WARNING)
    logging.getLogger("pika").setLevel(logging.DEBUG if debug else logging.CRITICAL)
    return handler

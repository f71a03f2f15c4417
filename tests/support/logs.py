"""The relay's log output captured in a test: `captured_logs` runs the relay's own log set-up into
a buffer, `CapturedLogs` gives its text and its JSON lines parsed."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from relay.ops.logs import setup_logging


@dataclass
class CapturedLogs:
    """Log output captured by `captured_logs`: its text, and its JSON lines parsed."""

    stream: io.StringIO

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text.splitlines()]

    def errors(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["level"] == "ERROR"]


@contextlib.contextmanager
def captured_logs(fmt: str = "json", level: str = "INFO") -> Iterator[CapturedLogs]:
    """The relay's log set-up (relay.ops.logs.setup_logging) writing to a buffer, for the
    duration of the block; the root logger's handlers and level are restored after."""
    root = logging.getLogger()
    before = root.level
    capture = CapturedLogs(io.StringIO())
    handler = setup_logging(level, fmt, capture.stream)
    try:
        yield capture
    finally:
        root.removeHandler(handler)
        root.setLevel(before)

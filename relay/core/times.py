"""Times as the relay writes them for people and programs: RFC 3339, UTC, milliseconds, `Z`.

One form everywhere a command prints a time (`status`, `inbox forget`), so a reader parses one
format: `2026-11-27T10:00:00.000Z`. Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt


def rfc3339(moment: dt.datetime) -> str:
    """`moment` in UTC with milliseconds and `Z` (a naive time is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

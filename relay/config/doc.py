"""The README's configuration table, generated from the settings' declarations (`make docs`;
tests/unit/test_config.py checks the README holds it)."""

from __future__ import annotations

import dataclasses
from typing import Any

from relay.config.table import public_fields
from relay.core.names import env_name


def _shown(default: Any) -> str:
    """A default as a user writes it (`true`, not `True`)."""
    return str(default).lower() if isinstance(default, bool) else str(default)


SETTINGS_DOC: list[tuple[str, str, str]] = [
    (
        env_name(f.name),
        _shown(f.default) if f.default is not dataclasses.MISSING else "host name and pid",
        f.metadata["help"],
    )
    for f in public_fields()
]


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{env}` | `{default}` | {meaning} |" for env, default, meaning in SETTINGS_DOC]
    return "\n".join(rows)

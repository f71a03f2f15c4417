"""Where an `outbox-relay replay` records its progress, so `--resume REPLAY_ID` continues it: a
JSON file per replay in a local folder (`--state-dir`, default `<cache dir>/replays`: RELAY_CACHE_DIR,
else ~/.cache/outbox-relay). Never in MongoDB: the live relay's leases and checkpoints are not
touched, and nothing the live relay reads is written.

The file holds the request (outboxes, range, filters, target topic, rate limit) and, per outbox, how far the
confirmed messages reach: after which document of the collection part ((occurredAt, _id), as
Extended JSON) and after which change of the oplog part (its resume token's `_data`), and whether
the outbox is done. It is written (atomically: a temporary file renamed) only after Kafka
acknowledged every message up to what it records, so a resume repeats nothing confirmed and skips
nothing unconfirmed.

How long it is kept: a replay that finishes removes its file (there is nothing left to resume); a
replay that stopped (a signal, an error) keeps it until `--resume` finishes it, or until it is
deleted by hand (`rm <state dir>/<replay id>.json`; nothing else reads it).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bson import json_util

from relay.cachedir import cache_dir
from relay.core.errors import ConfigError
from relay.core.namespace import Namespace

_JSON = json_util.RELAXED_JSON_OPTIONS.with_options(tz_aware=True, tzinfo=dt.UTC)


def default_state_dir() -> Path:
    """The folder of the replays' state files when --state-dir is not given."""
    return cache_dir() / "replays"


@dataclass
class OutboxProgress:
    """How far one outbox's confirmed messages reach (the module docstring)."""

    collection_after: str | None = None  # [occurredAt, _id] as relaxed Extended JSON
    oplog_after: str | None = None  # a resume token's `_data`
    collection_done: bool = False
    done: bool = False

    def collection_key(self) -> tuple[Any, Any] | None:
        if self.collection_after is None:
            return None
        at, last = json_util.loads(self.collection_after, json_options=_JSON)
        return at, last

    def set_collection_key(self, key: tuple[Any, Any]) -> None:
        self.collection_after = json_util.dumps(list(key), json_options=_JSON)


@dataclass
class ReplayState:
    """One replay's request and progress, saved in `<folder>/<id>.json`."""

    id: str
    request: dict[str, Any]
    progress: dict[str, OutboxProgress] = field(default_factory=dict)

    def outbox(self, namespace: Namespace) -> OutboxProgress:
        """The progress of the outbox `namespace` (saved under its text)."""
        return self.progress.setdefault(str(namespace), OutboxProgress())

    def save(self, folder: Path) -> Path:
        """Write the state atomically; returns the file."""
        folder.mkdir(parents=True, exist_ok=True)
        path = state_path(folder, self.id)
        text = json.dumps(
            {"id": self.id, "request": self.request, "progress": {k: asdict(v) for k, v in self.progress.items()}},
            indent=2,
        )
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text)
        os.replace(temporary, path)
        return path

    def remove(self, folder: Path) -> None:
        """Delete the state file (the replay finished: nothing to resume)."""
        state_path(folder, self.id).unlink(missing_ok=True)


def state_path(folder: Path, replay_id: str) -> Path:
    return folder / f"{replay_id}.json"


def load_state(folder: Path, replay_id: str) -> ReplayState:
    """The saved state of replay `replay_id`; ConfigError naming --resume when there is none."""
    try:
        uuid.UUID(replay_id)
    except ValueError as exc:
        raise ConfigError("--resume", f"{replay_id!r} is not a replay id (the UUID a replay prints at start)") from exc
    path = state_path(folder, replay_id)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(
            "--resume", f"no saved replay {replay_id!r} in {folder} (see --state-dir; a finished replay leaves none)"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ConfigError("--resume", f"cannot read {path}: {exc}") from exc
    progress = {k: OutboxProgress(**v) for k, v in raw.get("progress", {}).items()}
    return ReplayState(raw["id"], raw["request"], progress)

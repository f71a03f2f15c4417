"""Shared helpers for the static checks of the container files (no Docker engine needed)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from relay.config import Settings
from tests.support.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
KUBERNETES = ROOT / "deploy" / "kubernetes" / "orders-with-relay.yaml"


def load_yaml(path: Path) -> Any:
    """The YAML document, with `${VAR:-default}` read as its default (as compose does when VAR is
    unset: docker-compose.yml's image and host-port variables)."""
    return yaml.safe_load(re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", path.read_text()))


def tool(name: str) -> str | None:
    """An executable from this virtual environment (the `test` extra), else from PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def relay_settings(env: dict[str, str]) -> Settings:
    """The relay's own validation of a RELAY_* environment (raises ConfigError naming the setting)."""
    return Settings.load(env={k: str(v) for k, v in env.items() if k.startswith("RELAY_")})


def dockerignored(path: str) -> bool:
    """True when a .dockerignore pattern excludes `path` (a path relative to the context)."""
    excluded = False
    for line in DOCKERIGNORE.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        candidates = prefixes + [p.split("/")[-1] for p in prefixes] if pattern.startswith("**/") else prefixes
        if any(fnmatch.fnmatchcase(c, pattern.removeprefix("**/")) for c in candidates):
            excluded = not negate
    return excluded

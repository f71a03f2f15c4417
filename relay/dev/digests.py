"""Files the set-up downloads, pinned by SHA-256: used only when the digest is the pinned one."""

from __future__ import annotations

import hashlib
from pathlib import Path

from relay.dev.processes import DevStackError


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, expected: str, what: str) -> Path:
    """`path`, if its SHA-256 is `expected`; else the file is deleted and DevStackError names
    `what` and both digests."""
    found = sha256_of(path)
    if found != expected:
        path.unlink()
        raise DevStackError(f"{what}: SHA-256 {found}, expected {expected}; the download was deleted")
    return path

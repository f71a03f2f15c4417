"""Files the set-up downloads, pinned by SHA-256: used only when the digest is the pinned one.
`fetch` is the one HTTP download of the set-up (urllib over https, retried on network errors and
5xx answers only)."""

from __future__ import annotations

import hashlib
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from relay.dev.processes import DevStackError

_ATTEMPTS = 3  # per URL, on network errors and 5xx answers only (a 404 is final)
_TIMEOUT_S = 60.0


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500
    return isinstance(exc, OSError)  # URLError, connection resets, timeouts


def fetch(url: str, target: Path) -> Path:
    """`url`'s body into the file `target`; raises OSError (urllib's) after the retries."""
    for attempt in Retrying(
        retry=retry_if_exception(_transient),
        stop=stop_after_attempt(_ATTEMPTS),
        wait=wait_exponential(multiplier=1, max=8),
        reraise=True,
    ):
        with attempt, urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, open(target, "wb") as out:
            shutil.copyfileobj(response, out)
    return target


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

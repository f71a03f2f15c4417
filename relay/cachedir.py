"""Where the project caches what it downloads once (Kafka jars, the Spark connectors, a Schema
Registry): `RELAY_CACHE_DIR`, else `$XDG_CACHE_HOME/outbox-relay`, else `~/.cache/outbox-relay`.

A leaf module (standard library only): the dev tooling writes the cache, the Spark jobs read it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where downloaded artifacts and `dev up` state live between runs."""
    base = os.environ.get("RELAY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "outbox-relay"
    )
    return Path(base)

"""`python -m tests.containers.prepare` (run by `make test`): an engine and the stand-in bases.

Once per machine: installs podman, buildah, mmdebstrap and runc with apt-get when no Docker
works (root and apt-get needed) and builds the stand-in base and server images (1-10 minutes
each, see README "Containers"); later
runs find them in the engine's image store and take about a second. Where no engine can be had it
prints the reason and succeeds: the container tests then skip with that reason.
"""

from __future__ import annotations

import sys
import time

from tests.containers import bases, servers
from tests.containers.engine import Engine, EngineUnavailable


def main() -> int:
    start = time.monotonic()
    try:
        engine = Engine.find()
    except EngineUnavailable as exc:
        print(f"containers: no engine, the container tests will be skipped: {exc}", file=sys.stderr)
        return 0
    args = bases.ensure_bases(engine) | servers.ensure_servers(engine)
    stand_ins = ", ".join(f"{k}={v}" for k, v in args.items()) or "the public images"
    print(f"containers: {engine.kind} ready, bases {stand_ins} ({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

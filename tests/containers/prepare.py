"""`python -m tests.containers.prepare` (`make containers`, run by `make test`): an engine, the
stand-in bases and servers, and both images, before pytest starts.

Once per machine: installs podman, buildah, mmdebstrap and runc with apt-get when no Docker
works (root and apt-get needed) and builds the stand-in base and server images (1-10 minutes
each, see README "Containers"). Every run: builds the relay and pipeline images from the
Dockerfile (their layers cached: only what a change touches is rebuilt), so the container tests
start with them and build nothing in the middle of timing-sensitive tests; prints what was cached
or built, how long it took and every image's size; then removes the images nothing needs any more.
Where no engine can be had it prints the reason and succeeds: the container tests then skip with
that reason. A failing build prints the failing command's output and fails.
"""

from __future__ import annotations

import subprocess
import sys
import time

from tests.containers import bases, images, servers
from tests.containers.engine import Engine, EngineUnavailable


def _say(line: str) -> None:
    print(f"containers: {line}", file=sys.stderr, flush=True)


def _failed(what: str, exc: BaseException) -> int:
    if isinstance(exc, subprocess.CalledProcessError):
        output = f"{exc.stdout or ''}{exc.stderr or ''}".strip()
        detail = f"`{' '.join(map(str, exc.cmd))[:300]}` exited with {exc.returncode}:\n{output[-4000:]}"
    else:
        detail = str(exc)
    _say(f"{what} failed: {detail}")
    return 1


def main() -> int:
    start = time.monotonic()
    try:
        engine = Engine.find()
    except EngineUnavailable as exc:
        _say(f"no engine, the container tests will be skipped: {exc}")
        return 0
    _say(f"{engine.kind} ready ({time.monotonic() - start:.0f} s)")
    try:
        args = bases.ensure_bases(engine, _say)
        servers.ensure_servers(engine, _say)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        return _failed("building a stand-in image", exc)
    begun, steps = time.time(), set[str]()
    for target, ref in images.TARGETS.items():
        try:
            built = images.build(engine, target, ref, args)
        except (images.BuildFailed, subprocess.TimeoutExpired, OSError) as exc:
            return _failed(f"building the {target} image", exc)
        steps |= built.steps
        _say(f"image {ref}: built in {built.seconds:.0f} s (layers cached where unchanged), {built.size_mb:.0f} MB")
    pruning = time.monotonic()
    removed = images.prune(engine, steps, begun)
    _say(f"removed {removed} unused image(s) in {time.monotonic() - pruning:.0f} s; "
         f"ready in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The project's images, built from its own Dockerfile for the container tests.

`make containers` (tests.containers.prepare) builds both before pytest starts; the session
fixtures then only check that the image in the store is the one built from the current sources
(the context's digest, recorded beside the engine's state) and build it only when it is not (a
developer running the container tests alone after an edit).

With podman, `buildah bud --isolation chroot --format docker --layers` builds (RUN steps on the
host's network; `--format docker` keeps HEALTHCHECK, which the OCI format drops; `--layers` keeps
every step's layer across runs) with the stand-in bases as build arguments. With Docker,
`docker build` with the Dockerfile's public bases. `prune` then removes the images no tag and no
build of this run needs (superseded images and their layers), so the store does not grow with
every change.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.containers.engine import Engine, state_dir

ROOT = Path(__file__).resolve().parents[2]
RELAY_IMAGE = "localhost/outbox-relay:test"
PIPELINE_IMAGE = "localhost/outbox-relay-pipeline:test"
TARGETS = {"relay": RELAY_IMAGE, "pipeline": PIPELINE_IMAGE}

# What the Dockerfile copies from the build context (.dockerignore keeps the rest out).
_CONTEXT = ("Dockerfile", "pyproject.toml", "constraints.txt", "MANIFEST.in", "build-constraints.txt",
            "tools/build_wheel.py", "native/Cargo.toml", "native/Cargo.lock", "native/src", "relay", "schemas")
_SKIP = re.compile(r"(__pycache__|\.pyc$|^relay/_native.*\.so$)")
# buildah's step lines: "--> Using cache <id>" (a cached step) and "--> <id>" (a new one).
_STEP_ID = re.compile(r"^--> (?:Using cache )?([0-9a-f]{11,64})\s*$", re.M)


@dataclass(frozen=True)
class Built:
    ref: str
    seconds: float
    size_mb: float
    steps: frozenset[str] = field(default=frozenset(), compare=False)  # image ids of its steps


class BuildFailed(Exception):
    """A build's command and the tail of its output."""

    def __init__(self, argv: list[str], returncode: int, output: str) -> None:
        super().__init__(f"`{' '.join(argv[:3])} ...` exited with {returncode}:\n{output[-4000:]}")


def context_digest(args: dict[str, str]) -> str:
    """A digest of the files the image is built from, and the build arguments."""
    h = hashlib.sha256(json.dumps(args, sort_keys=True).encode())
    for top in _CONTEXT:
        path = ROOT / top
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if not _SKIP.search(rel):
                h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _records_path() -> Path:
    return state_dir() / "images.json"


def _records() -> dict[str, dict[str, str]]:
    try:
        return dict(json.loads(_records_path().read_text()))
    except (OSError, ValueError):
        return {}


def _record(ref: str, image_id: str, digest: str) -> None:
    records = _records()
    records[ref] = {"id": image_id, "context": digest}
    _records_path().write_text(json.dumps(records, indent=2))


def _image_id(engine: Engine, ref: str) -> str | None:
    done = engine.run("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    if done.returncode != 0:
        return None
    return done.stdout.strip().removeprefix("sha256:") or None


def is_current(engine: Engine, ref: str, args: dict[str, str]) -> bool:
    """Whether `ref` is in the store and was built from the current sources with `args`."""
    record = _records().get(ref)
    return bool(record) and record["context"] == context_digest(args) and _image_id(engine, ref) == record["id"]


def _build_argv(engine: Engine, target: str, ref: str, args: dict[str, str]) -> list[str]:
    build_args = [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
    common = ["--target", target, "-t", ref, *build_args, "-f", str(ROOT / "Dockerfile"), str(ROOT)]
    if engine.kind == "docker":
        return ["docker", "build", "--quiet", *common]
    return ["buildah", "bud", "--isolation", "chroot", "--format", "docker", "--layers", *common]


def build(engine: Engine, target: str, ref: str, args: dict[str, str]) -> Built:
    """Build one target of the Dockerfile as `ref` and record it; raises BuildFailed."""
    start = time.monotonic()
    digest = context_digest(args)
    argv = _build_argv(engine, target, ref, args)
    env = engine.environ() | ({"DOCKER_BUILDKIT": "1"} if engine.kind == "docker" else {})
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise BuildFailed(argv, done.returncode, done.stdout[-2000:] + done.stderr)
    image_id = _image_id(engine, ref) or ""
    _record(ref, image_id, digest)
    steps = frozenset(_STEP_ID.findall(done.stdout + done.stderr)) | {image_id}
    return Built(ref, time.monotonic() - start, engine.size_mb(ref), steps)


def ensure(engine: Engine, target: str, args: dict[str, str]) -> Built | None:
    """The `target` image from the current sources: None when `make containers` built it, else
    built now (and returned)."""
    ref = TARGETS[target]
    return None if is_current(engine, ref, args) else build(engine, target, ref, args)


def prune(engine: Engine, keep: set[str], before: float) -> int:
    """Remove the untagged images nothing needs (no tag, no child image, no container), except the
    steps of this run's builds (`keep`, ids or their prefixes) and any created after `before` (a
    time.time(): another build may be under way); repeated until none is left. With Docker:
    `docker image prune` (BuildKit keeps its cache apart from images). Returns how many went."""
    if engine.kind == "docker":
        engine.run("image", "prune", "--force", check=False)
        return 0
    until = str(int(before))
    removed = 0
    while True:
        listed = engine.run("images", "--all", "--no-trunc", "--quiet", "--filter", "dangling=true",
                            "--filter", "containers=false", "--filter", f"until={until}", check=False)
        ids = {line.strip().removeprefix("sha256:") for line in listed.stdout.splitlines() if line.strip()}
        doomed = sorted(i for i in ids if not any(i.startswith(k) for k in keep))
        if listed.returncode != 0 or not doomed:
            return removed
        gone = engine.run("rmi", *doomed, check=False)
        now = removed + sum(1 for i in doomed if i[:12] in gone.stdout)
        if now == removed:  # nothing could go (in use): stop rather than loop
            return removed
        removed = now


def healthcheck(engine: Engine, ref: str) -> list[str]:
    """The image's HEALTHCHECK test (["CMD", ...]); podman's CLI keeps it beside Config, and its
    Docker API (4.3) leaves it out of the image's Config, so the engine's CLI is asked."""
    info = engine.inspect(ref)
    config = info.get("Config")
    found = (config.get("Healthcheck") if isinstance(config, dict) else None) or info.get("Healthcheck")
    assert isinstance(found, dict) and found.get("Test"), f"{ref} has no HEALTHCHECK (built without --format docker?)"
    return [str(arg) for arg in found["Test"]]

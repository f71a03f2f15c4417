"""The project's images, built from its own Dockerfile for the container tests.

With podman, `buildah bud --isolation chroot --format docker --layers` builds (RUN steps on the
host's network; `--format docker` keeps HEALTHCHECK, which the OCI format drops; `--layers` keeps
the dependency layers across runs) with the stand-in bases as build arguments. With Docker,
`docker build` with the Dockerfile's public bases.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.containers.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
RELAY_IMAGE = "localhost/outbox-relay:test"
PIPELINE_IMAGE = "localhost/outbox-relay-pipeline:test"


@dataclass(frozen=True)
class Built:
    ref: str
    seconds: float
    size_mb: float


def _build_argv(engine: Engine, target: str, ref: str, args: dict[str, str]) -> list[str]:
    build_args = [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
    common = ["--target", target, "-t", ref, *build_args, "-f", str(ROOT / "Dockerfile"), str(ROOT)]
    if engine.kind == "docker":
        return ["docker", "build", "--quiet", *common]
    return ["buildah", "bud", "--quiet", "--isolation", "chroot", "--format", "docker", "--layers", *common]


def build(engine: Engine, target: str, ref: str, args: dict[str, str]) -> Built:
    """Build one target of the Dockerfile as `ref`; raises CalledProcessError with buildah's output."""
    start = time.monotonic()
    argv = _build_argv(engine, target, ref, args)
    done = subprocess.run(argv, capture_output=True, text=True, env=engine.environ(), timeout=3600)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr[-4000:])
    size = float(str(engine.inspect(ref)["Size"]))
    return Built(ref, time.monotonic() - start, size / 1e6)


def healthcheck(engine: Engine, ref: str) -> list[str]:
    """The image's HEALTHCHECK test (["CMD", ...]); podman's CLI keeps it beside Config, and its
    Docker API (4.3) leaves it out of the image's Config, so the engine's CLI is asked."""
    info = engine.inspect(ref)
    config = info.get("Config")
    found = (config.get("Healthcheck") if isinstance(config, dict) else None) or info.get("Healthcheck")
    assert isinstance(found, dict) and found.get("Test"), f"{ref} has no HEALTHCHECK (built without --format docker?)"
    return [str(arg) for arg in found["Test"]]

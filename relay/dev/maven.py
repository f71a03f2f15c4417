"""Resolving JVM artifacts: a pom's runtime jars copied by Maven into a cache folder.

Invariant: a folder counts as resolved only when its `.complete` marker exists; jars are copied
into a staging folder first and renamed into place, so an interrupted run leaves nothing that
looks complete. Later runs (and runs without network) use the folder as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

COMPLETE = ".complete"


class MavenError(Exception):
    """Raised when Maven is missing or cannot resolve a pom; carries Maven's output."""


def is_resolved(target: Path) -> bool:
    return (target / COMPLETE).exists()


def copy_dependencies(
    pom: Traversable | Path,
    target: Path,
    properties: dict[str, str],
    exclude: set[str] | None = None,
    profile: str | None = None,
) -> Path:
    """`mvn dependency:copy-dependencies` of `pom` (runtime scope, with Maven `profile` active
    if given) into `target`, atomically."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError("Maven (mvn) is needed once to resolve the jars; install it")
    staging = target.parent / f"{target.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    argv = [
        mvn,
        "-q",
        "-B",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
        *(f"-D{k}={v}" for k, v in properties.items()),
    ]
    if exclude:
        argv.append(f"-DexcludeArtifactIds={','.join(sorted(exclude))}")
    if profile:
        argv += ["-P", profile]
    with resources.as_file(pom) as pom_path:
        proc = subprocess.run([*argv, "-f", str(pom_path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not any(staging.glob("*.jar")):
        shutil.rmtree(staging, ignore_errors=True)
        raise MavenError(f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    (staging / COMPLETE).write_text(" ".join(f"{k}={v}" for k, v in properties.items()))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def copy_artifact(coordinates: str, target: Path) -> Path:
    """`mvn dependency:copy` of one artifact (`group:artifact:version[:type[:classifier]]`, no
    pom needed) into the folder `target`; returns the file's path. The caller unpacks or uses it
    and marks its own result complete."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(f"Maven (mvn) is needed once to resolve {coordinates}; install it")
    target.mkdir(parents=True, exist_ok=True)
    argv = [mvn, "-q", "-B", "dependency:copy", f"-Dartifact={coordinates}", f"-DoutputDirectory={target}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    files = [p for p in target.iterdir() if p.is_file()]
    if proc.returncode != 0 or len(files) != 1:
        raise MavenError(f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return files[0]

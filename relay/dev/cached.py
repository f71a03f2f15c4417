"""Folders of the project cache made once, and virtual environments of dependencies kept there.

Invariants:
- a folder of the cache is complete only with its `.complete` marker (relay.dev.maven); it is
  made in a `.partial-<pid>` folder beside it, marked, then renamed into place in one step, so an
  interrupted run leaves nothing that looks complete; of two processes (pytest workers) making
  the same folder at once, the first rename wins and the other drops its own and uses the
  winner's;
- a virtual environment of dependencies (`venv_with`) holds what pip resolves for a requirement
  list under constraints.txt and nothing else; its folder's name ends with a digest of all that
  determines it (the Python, constraints.txt's text, the requirements), so changing any of them
  makes a new folder (old ones stay until the cache is cleared). It is never installed into:
  each user takes a `fresh_copy`. The copy works where it lands: a venv finds its base Python
  through pyvenv.cfg's `home`, an absolute path outside the venv that does not move, and its own
  prefix from where its `bin/python` is; only its scripts' shebangs still name the cached folder,
  so what runs in a copy runs as `python -m ...`.
"""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from relay.dev.maven import COMPLETE, is_resolved
from relay.dev.processes import DevStackError


def made_once(home: Path, make: Callable[[Path], str]) -> Path:
    """`home`, made by `make(staging)` unless it is complete already. `make` creates and fills
    the folder it is given and returns the marker's text (what the folder holds)."""
    if is_resolved(home):
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    staging = home.parent / f"{home.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        note = make(staging)
        (staging / COMPLETE).write_text(note)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for _ in range(3):
        try:
            staging.rename(home)
            return home
        except OSError:
            if is_resolved(home):  # another process renamed its copy first: use the winner's
                shutil.rmtree(staging, ignore_errors=True)
                return home
            _set_aside(home)  # an incomplete folder no run of this module leaves: out of the way
    shutil.rmtree(staging, ignore_errors=True)
    raise DevStackError(f"could not rename a made folder to {home}")


def _set_aside(home: Path) -> None:
    stale = home.parent / f"{home.name}.stale-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        home.rename(stale)
    shutil.rmtree(stale, ignore_errors=True)


def digest(*texts: str) -> str:
    """A short name for everything in `texts` (16 hex digits of their SHA-256)."""
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]


def requires_dist(wheel: Path) -> tuple[str, ...]:
    """What installing the wheel without extras pulls in: its METADATA's Requires-Dist lines
    whose marker names no extra (a marker of the platform stays, pip evaluates it), sorted."""
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        message = email.parser.BytesParser().parsebytes(archive.read(metadata))
    lines = message.get_all("Requires-Dist") or []
    return tuple(sorted(line for line in lines if not re.search(r"\bextra\b", line.partition(";")[2])))


def venv_with(
    where: Path,
    python: str,
    create: Callable[[Path], list[str]],
    requirements: Sequence[str],
    constraints: Path,
    env: Mapping[str, str],
    options: Sequence[str] = (),
) -> Path:
    """The cached virtual environment `<where>-<digest>` holding `requirements` as pip resolves
    them under `constraints` (with `options`), made once: `create(home)` makes the environment
    and returns the argv that runs its Python; `python` names that Python for the digest (its
    version and where it lives). Returns the folder: take a `fresh_copy` of it to install into."""
    home = where.parent / f"{where.name}-{digest(python, constraints.read_text(), *requirements)}"

    def make(staging: Path) -> str:
        argv = [*create(staging), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *options]
        argv += ["-c", str(constraints), *requirements]
        done = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=1800, env=dict(env), cwd=staging
        )
        if done.returncode != 0:
            raise DevStackError(
                f"pip install of {' '.join(requirements)} into {home} exited {done.returncode}: {done.stderr[-3000:]}"
            )
        return "\n".join([python, *requirements])

    return made_once(home, make)


def fresh_copy(cached: Path, home: Path) -> Path:
    """A copy of the cached virtual environment `cached` at `home` (absent); returns its python."""
    shutil.copytree(cached, home, symlinks=True, ignore=shutil.ignore_patterns(COMPLETE))
    return home / "bin" / "python"

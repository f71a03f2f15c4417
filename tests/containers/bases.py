"""Stand-in base images, built once into the engine's image store (test set-up only).

No image registry is reachable here, so the Dockerfile's public bases (`python:3.11-slim-bookworm`,
`rust:*-slim-bookworm`) are stood in for by images built from Debian 12's packages with
mmdebstrap and `podman import`: Python 3.11 (with `python` on PATH, as the python image has), and
Rust from `rustc-web`/`cargo-web` with gcc. When the host trusts an intercepting CA
(/usr/local/share/ca-certificates), the bases carry it and PIP_CERT/SSL_CERT_FILE, or pip inside
a build fails with CERTIFICATE_VERIFY_FAILED. With Docker (users' machines) none of this is used:
the public bases are pulled.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.containers.engine import Engine

PYTHON_BASE = "localhost/outbox-relay-base/python:3.11-bookworm"
RUST_BASE = "localhost/outbox-relay-base/rust:bookworm"

_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
_PACKAGES = {
    PYTHON_BASE: "python3,python3-venv,python3-pip,python-is-python3,ca-certificates",
    RUST_BASE: "rustc-web,cargo-web,gcc,libc6-dev,ca-certificates",
}
_HOST_CAS = Path("/usr/local/share/ca-certificates")
_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _host_cas() -> list[Path]:
    return sorted(_HOST_CAS.glob("*.crt")) if _HOST_CAS.is_dir() else []


def _mmdebstrap(packages: str, out: Path) -> None:
    hooks: list[str] = []
    for ca in _host_cas():
        hooks += ["--customize-hook", f'copy-in "{ca}" /usr/local/share/ca-certificates/']
    hooks += ["--customize-hook", 'chroot "$1" update-ca-certificates --fresh >/dev/null']
    hooks += ["--customize-hook", 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*']
    argv = ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={packages}", *hooks, "bookworm", str(out)]
    subprocess.run([*argv, *_MIRRORS], check=True, capture_output=True, text=True)


def _changes() -> list[str]:
    env = ["ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "ENV=LANG=C.UTF-8"]
    if _host_cas():
        env += [f"ENV=PIP_CERT={_BUNDLE}", f"ENV=SSL_CERT_FILE={_BUNDLE}", f"ENV=REQUESTS_CA_BUNDLE={_BUNDLE}"]
    return [arg for change in [*env, 'CMD=["/bin/bash"]'] for arg in ("--change", change)]


def build_base(engine: Engine, ref: str) -> float:
    """Build one stand-in base (mmdebstrap, then import); returns the seconds it took."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="relay-base-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        _mmdebstrap(_PACKAGES[ref], tar)
        engine.run("import", *_changes(), str(tar), ref)
    return time.monotonic() - start


def ensure_images(engine: Engine, refs: Iterable[str], what: str, build: Callable[[Engine, str], float],
                  log: Callable[[str], None] | None = None) -> None:
    """Build each of `refs` that the engine lacks with `build` (which returns its seconds); `log`
    gets one line per image: `<what> <ref>: cached` or `built now in N s`, and its size."""
    for ref in refs:
        if engine.image_exists(ref):
            state = "cached"
        else:
            print(f"building {what} {ref} (once) ...", file=sys.stderr, flush=True)
            state = f"built now in {build(engine, ref):.0f} s"
        if log is not None:
            log(f"{what} {ref}: {state}, {engine.size_mb(ref):.0f} MB")


def ensure_bases(engine: Engine, log: Callable[[str], None] | None = None) -> dict[str, str]:
    """The build arguments that select the stand-in bases (built when missing); {} with Docker."""
    if engine.kind == "docker":
        return {}
    ensure_images(engine, _PACKAGES, "stand-in base", build_base, log)
    return {"PYTHON_IMAGE": PYTHON_BASE, "RUST_IMAGE": RUST_BASE}

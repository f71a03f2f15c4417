"""The aarch64 wheel on an x86_64 machine: Debian's Rust and Python for arm64, and qemu-user.

rustup cannot fetch Rust's standard library for aarch64 here, but Debian packages one for its own
compiler (`rustc-web`, with `libstd-rust-web-dev:arm64`). Unpacked into one folder, that rustc's
sysroot holds both targets: `tools/build_wheel.py --arch aarch64` builds with it (cargo-zigbuild
and zig link for glibc 2.17 on aarch64, as they do for x86_64). To test the wheel, Debian's arm64
Python 3.11 runs under `qemu-aarch64-static` (user-mode emulation, no binfmt_misc: every arm64
process is started through qemu by its x86_64 parent, `Emulated.argv`). The wheel's dependencies
(PyPI's aarch64 wheels) are installed under emulation once per key into a cached virtual
environment (`Emulated.venv_with`); a test installs the wheel alone into a copy of it.

Every package is pinned by file name and SHA-256 (relay.dev.debian); each folder is complete only
with its `.complete` marker. They are Debian 12's current builds: a security update replaces
a file in the security pool (`updates/...`), after which its pin must move with it (the download
then fails naming the URL). Set-up only: nothing here is installed into the system.

    python -m relay.dev.aarch64 build [--out dist]   # the aarch64 wheel, as `make dist-aarch64` does
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from relay.cachedir import cache_dir
from relay.dev import cached, debian
from relay.dev.debian import DebianPackage

MAIN = ("https://deb.debian.org/debian",)
SECURITY = ("https://deb.debian.org/debian-security", "https://security.debian.org/debian-security")
RUST_VERSION = "1.96.0+dfsg1-1~deb12u2"
PYTHON_VERSION = "3.11.2-6+deb12u9"


def _deb(name: str, version: str, arch: str, pool: str, sha256: str) -> DebianPackage:
    return DebianPackage(name=name, version=version, architecture=arch, pool=pool, sha256=sha256)


_RUSTC = "updates/main/r/rustc-web"
# Debian's rustc 1.96 for amd64 with its standard library for both targets (security pool).
RUST = (
    _deb(
        "rustc-web", RUST_VERSION, "amd64", _RUSTC, "8fefe1d6377fe4082f5a9d2a47e095e2d20319eaab9754bd2f0275155c9adf90"
    ),
    _deb(
        "libstd-rust-web-1.96",
        RUST_VERSION,
        "amd64",
        _RUSTC,
        "3755f30434ae29574c91b0beb86632bee401607b0ac35c3e52810f9a53fae0d1",
    ),
    _deb(
        "libstd-rust-web-dev",
        RUST_VERSION,
        "amd64",
        _RUSTC,
        "e38dbeaaad673fc63fb47c5140cf34da271ac71c3ecafc828b762c2fb01fe77a",
    ),
    _deb(
        "libstd-rust-web-dev",
        RUST_VERSION,
        "arm64",
        _RUSTC,
        "02419380801b9f61391294823659b17b90f7a863ca3bbccb9140d2f0f8a2c910",
    ),
)
# rustc-web's LLVM (security pool).
LLVM = _deb(
    "libllvm22",
    "22.1.8-1~deb12u1",
    "amd64",
    "updates/main/l/llvm-toolchain-22",
    "729ec3e943d320515c2bbdc96acfffd7ce34861e62bd5c42726bf586d644dfe2",
)
QEMU = _deb(
    "qemu-user-static",
    "7.2+dfsg-7+deb12u18+b3",
    "amd64",
    "main/q/qemu",
    "c3e3ba2bd87f8c5b9a5da5ef21b5a3b82d7c63b89dd448d9ddaa4eabc5b6e402",
)
# Debian 12's arm64 Python 3.11 and what it and the package's dependencies' wheels load.
PYTHON = (
    _deb(
        "libc6",
        "2.36-9+deb12u14",
        "arm64",
        "main/g/glibc",
        "01f4330719fd4f65580e16ea5a0527f372fca750e8f588d26deaf09f2d3b1cf4",
    ),
    _deb(
        "libgcc-s1",
        "12.2.0-14+deb12u1",
        "arm64",
        "main/g/gcc-12",
        "576926b283613db80168ddf76380a3bd877602778cf0d226caa7bfbfa71eacf3",
    ),
    _deb(
        "libstdc++6",
        "12.2.0-14+deb12u1",
        "arm64",
        "main/g/gcc-12",
        "26e138c677a985775331373828a6c286c551ff397cb735d00e2383cb273d1cb2",
    ),
    _deb(
        "python3.11-minimal",
        PYTHON_VERSION,
        "arm64",
        "updates/main/p/python3.11",
        "617855dbf3299e03873926c75d61feaf3d36924586aecc1951a0b965a95bc694",
    ),
    _deb(
        "libpython3.11-minimal",
        PYTHON_VERSION,
        "arm64",
        "updates/main/p/python3.11",
        "dd9847d2f77c5a924b1d3dd953b81f161db9374c94d03b9216191925350928c3",
    ),
    _deb(
        "libpython3.11-stdlib",
        PYTHON_VERSION,
        "arm64",
        "updates/main/p/python3.11",
        "9937cbe3f647aa89a590fec647438ce02098c113d1c6f70e4cb1230c368d42a4",
    ),
    _deb(
        "python3.11-venv",
        PYTHON_VERSION,
        "arm64",
        "updates/main/p/python3.11",
        "bc155b92437e80122ac68ccf37cca2ddab3462025e429109bffdf1cb4e8e93d4",
    ),
    _deb(
        "python3-pip-whl",
        "23.0.1+dfsg-1",
        "all",
        "main/p/python-pip",
        "cc373690a1cb469fb301b9fe0125048e3102f2e365d1b2d27cab091ec89fccdc",
    ),
    _deb(
        "zlib1g",
        "1.2.13.dfsg-1",
        "arm64",
        "main/z/zlib",
        "52b8b8a145bbe1956bba82034f77022cbef0c3d0885c9e32d9817a7932fe1913",
    ),
    _deb(
        "libexpat1",
        "2.5.0-1+deb12u5",
        "arm64",
        "updates/main/e/expat",
        "4a733e7f636de4a4483e3e5d7b02dc8e788b115361a04dd58df89461ce2ae65a",
    ),
    _deb(
        "libssl3",
        "3.0.22-1~deb12u2",
        "arm64",
        "updates/main/o/openssl",
        "3d04ecd8d0f57fed50d205abaeedfcc84c1960073ea085719c00add44b0ccd7f",
    ),
    _deb(
        "libffi8",
        "3.4.4-1",
        "arm64",
        "main/libf/libffi",
        "80b5c36177dc0e29d531c7eddbed3cc7355cb490e49f8cfa5959572d161f27b3",
    ),
    _deb(
        "libbz2-1.0",
        "1.0.8-5+b1",
        "arm64",
        "main/b/bzip2",
        "d3a96ece03326498b39ff093a76800dfcbcb1d4049d6ae6e9f6fa1aa7a590ad6",
    ),
    _deb(
        "liblzma5",
        "5.4.1-1+deb12u2",
        "arm64",
        "updates/main/x/xz-utils",
        "36358d245f246234721e6c1c2ee5d11a46c1c877023c63f7570df02cd79964f5",
    ),
    _deb(
        "libuuid1",
        "2.38.1-5+deb12u3",
        "arm64",
        "main/u/util-linux",
        "3b2d19df0f3190108cf54228c4cfc822226c06d8f3615a5ab16a7dffb1f58aed",
    ),
    _deb(
        "libcrypt1",
        "4.4.33-2",
        "arm64",
        "main/libx/libxcrypt",
        "eea0ad76ea5eb507127fea0c291622ea4ecdbb71c4b9a8ed9c76ae33fc1a0127",
    ),
    _deb(
        "libzstd1",
        "1.5.4+dfsg2-5",
        "arm64",
        "main/libz/libzstd",
        "95e173c9538f96ede4fc275ec7863f395a97dd0ea62454be9bc914efa1b9be93",
    ),
)


def _unpacked(name: str, packages: tuple[DebianPackage, ...]) -> Path:
    """`packages` unpacked into one folder of the cache (fetched and checked once)."""

    def make(staging: Path) -> str:
        downloads = staging.parent / f"{name}.downloads-{os.getpid()}"
        try:
            for package in packages:
                mirrors = SECURITY if package.pool.startswith("updates/") else MAIN
                debian.unpack(debian.download(package, downloads, mirrors), staging)
        finally:
            shutil.rmtree(downloads, ignore_errors=True)
        return " ".join(p.filename for p in packages)

    return cached.made_once(cache_dir() / "aarch64" / name, make)


@dataclass(frozen=True)
class Rust:
    """Debian's rustc (its sysroot has the x86_64 and the aarch64 standard library)."""

    root: Path

    @property
    def rustc(self) -> Path:
        return self.root / "usr" / "bin" / "rustc"

    def environ(self) -> dict[str, str]:
        """RUSTC, and the folder of its own libraries (librustc_driver, LLVM) first on LD_LIBRARY_PATH."""
        libs = [str(self.root / "usr" / "lib" / "x86_64-linux-gnu"), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        return {"RUSTC": str(self.rustc), "LD_LIBRARY_PATH": os.pathsep.join(libs)}


def rust() -> Rust:
    return Rust(_unpacked(f"rust-{RUST_VERSION.replace('~', '-')}", (*RUST, LLVM)))


@dataclass(frozen=True)
class Emulated:
    """Debian's arm64 Python under qemu-user: `argv(python, ...)` runs an arm64 program."""

    qemu: Path
    root: Path  # the arm64 system folder: qemu looks up absolute paths here first (-L)

    @property
    def python(self) -> Path:
        return self.root / "usr" / "bin" / "python3.11"

    def argv(self, program: Path | str, *args: str) -> list[str]:
        return [str(self.qemu), "-L", str(self.root), str(program), *args]

    @staticmethod
    def environ(extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment without what would point the arm64 Python at this
        machine's packages (PYTHONPATH, PYTHONHOME, VIRTUAL_ENV), plus `extra`."""
        kept = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        return kept | (extra or {})

    def venv(self, home: Path) -> Path:
        """A virtual environment of the arm64 Python (copies, not links: qemu opens the program
        itself, outside `root`) with pip, run from the Debian pip wheel in-process (venv's own
        ensurepip starts a child Python, which only binfmt_misc could run). Returns its python."""
        subprocess.run(
            self.argv(self.python, "-m", "venv", "--without-pip", "--copies", str(home)),
            check=True,
            capture_output=True,
            timeout=600,
        )
        [pip_wheel] = (self.root / "usr" / "share" / "python-wheels").glob("pip-*.whl")
        python = home / "bin" / "python"
        subprocess.run(
            self.argv(python, f"{pip_wheel}/pip", "install", "--quiet", "--disable-pip-version-check", str(pip_wheel)),
            check=True,
            capture_output=True,
            timeout=900,
        )
        return python

    def venv_with(self, requirements: Sequence[str], constraints: Path) -> Path:
        """The cached virtual environment (`venv`) holding `requirements` as pip resolves them
        under `constraints` from PyPI's aarch64 wheels (binaries only), made once under emulation
        (about a minute) into `<cache>/aarch64/venv-<digest>`. Its key is the Debian packages the
        Python comes from (their pinned file names), constraints.txt's text and `requirements`;
        it is complete only with its marker (relay.dev.cached). Install into a `fresh_copy`."""
        return cached.venv_with(
            cache_dir() / "aarch64" / "venv",
            " ".join(p.filename for p in PYTHON),
            lambda home: self.argv(self.venv(home)),
            requirements,
            constraints,
            self.environ(),
            ["--only-binary=:all:"],
        )


def emulated() -> Emulated:
    qemu = _unpacked("qemu-7.2", (QEMU,))
    root = _unpacked(f"python-{PYTHON_VERSION.replace('~', '-')}", PYTHON)
    return Emulated(qemu / "usr" / "bin" / "qemu-aarch64-static", root)


def build(out: Path) -> Path:
    """The aarch64 wheel into `out` (tools/build_wheel.py --arch aarch64 with Debian's rustc)."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "build_wheel.py"
    env = {**os.environ, **rust().environ()}
    subprocess.run(
        [sys.executable, str(tool), "--arch", "aarch64", "--no-sdist", "--out", str(out)], check=True, env=env
    )
    [wheel] = out.glob("outbox_relay-*aarch64*.whl")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the aarch64 wheel with Debian's Rust (relay.dev.aarch64)")
    parser.add_argument("action", choices=["build"])
    parser.add_argument("--out", type=Path, default=Path("dist"))
    args = parser.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

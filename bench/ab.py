"""A/B of relay code at steady rates: two (or more) commits' relays in alternating rounds, one stack.

Run: `.venv/bin/python -m bench.ab --commit ff9c6a1 --commit HEAD [--steps 1000,3000]
[--seconds 20] [--rounds 2]`, or `--code NAME=FOLDER` for a tree already prepared (a checkout whose
`relay` package has its compiled module beside it).

Each `--commit` is prepared once into the cache (`~/.cache/outbox-relay/bench-ab/<sha>`): the
commit's files (`git archive`), its compiled module built with cargo from its own native/ and
copied beside its `relay` package, so the relay that runs is that commit's, Python and Rust
alike. Then, on one local stack, each step runs every tree's relay as deployed (`python -m relay
run` from that tree, bench.relay_process) once per round, in an order rotated every round, with
the same writer (bench.scenarios.steady): the machine's drift falls on every tree alike. The report
gives every round and, per tree, the medians and ranges of the end-to-end and own-share latency.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

from bench.common import progress
from bench.events import EventFactory
from bench.relay_process import ROOT
from bench.scenarios.steady import (
    Maker,
    format_rounds,
    format_steady,
    latency_rounds,
    parse_steps,
    relay_maker,
    summarize,
)
from bench.stack import bench_stack
from relay.cachedir import cache_dir

CARGO = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")


def commit_tree(commit: str) -> tuple[str, Path]:
    """(short sha, folder) of `commit` prepared as the module docstring says; built once."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", commit], capture_output=True, text=True,
                         check=True).stdout.strip()
    base = cache_dir() / "bench-ab"
    tree = base / sha
    module = tree / "relay" / f"_native{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    if module.exists():
        return sha, tree
    progress(f"preparing {sha} in {tree} (git archive, cargo build --release)")
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", "-C", str(ROOT), "archive", sha], stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(tree, filter="data")
    if (tree / "native" / "Cargo.toml").exists():
        for source in (tree / "native" / "src").glob("*.rs"):
            source.touch()  # the shared target folder rebuilds this commit's crate, not another's
        env = {**os.environ, "CARGO_TARGET_DIR": str(base / "target")}
        subprocess.run([CARGO, "build", "--release", "--locked", "--manifest-path", str(tree / "native" / "Cargo.toml")],
                       env=env, check=True)
        shutil.copyfile(base / "target" / "release" / "lib_native.so", module)
    return sha, tree


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.splitlines()[0])
    p.add_argument("--commit", action="append", default=[], help="a commit to run (repeatable)")
    p.add_argument("--code", action="append", default=[], metavar="NAME=FOLDER",
                   help="a prepared code tree to run (repeatable)")
    p.add_argument("--steps", default="1000,3000",
                   help="RATE[xBATCH],... (events/s, events per transaction; default 1000,3000)")
    p.add_argument("--seconds", type=float, default=20.0, help="writes per round (default 20 s)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per step (default 2)")
    p.add_argument("--payload-bytes", type=int, default=200)
    args = p.parse_args(argv)
    args.steps = parse_steps(args.steps)
    if len(args.commit) + len(args.code) < 1 or args.rounds < 1:
        p.error("at least one --commit or --code, and --rounds >= 1")
    return args


def trees(args: argparse.Namespace) -> list[tuple[str, Path]]:
    out = [commit_tree(c) for c in args.commit]
    for spec in args.code:
        name, _, folder = spec.partition("=")
        out.append((name, Path(folder).resolve()))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code = trees(args)
    with bench_stack() as (stack, client):
        run_id = uuid.uuid4().hex[:6]
        entrants: list[tuple[str, Maker]] = [
            (f"ab{i}", relay_maker(stack, client, run_id, code=folder, label=f"relay @{name}"))
            for i, (name, folder) in enumerate(code)]
        results = latency_rounds(stack, client, EventFactory(args.payload_bytes), args.payload_bytes,
                                 args.steps, args.seconds, args.rounds, entrants, run_id)
    print("\n".join([f"bench.ab: {', '.join(f'{n} = {f}' for n, f in code)}; load average at end "
                     + "/".join(f"{x:.1f}" for x in os.getloadavg()), "", *format_rounds(results), "",
                     *format_steady(summarize(results, strict=False), args.rounds)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

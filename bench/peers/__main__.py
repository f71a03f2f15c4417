"""`python -m bench.peers fetch`: resolve the Connect peers' jars with Maven and build Conduit now (once)."""

from __future__ import annotations

import argparse
import sys

from bench.peers import conduit
from bench.peers.connect import PROFILES, PeerError, fetch_jars


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("command", choices=["fetch"])
    p.parse_args(argv)
    status = 0
    try:
        jars = fetch_jars()
        for profile in PROFILES:
            print(f"{profile}: {jars.lib(profile)} ({len(list(jars.lib(profile).glob('*.jar')))} jars)")
    except PeerError as exc:
        print(f"bench.peers: {exc}", file=sys.stderr)
        status = 1
    try:
        binaries = conduit.build()
        print(f"conduit: {binaries.conduit}, connectors: {binaries.connectors}")
    except PeerError as exc:
        print(f"bench.peers: {exc}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

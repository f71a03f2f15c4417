"""`python -m bench.peers fetch`: resolve the peers' jars with Maven now (once), print where."""

from __future__ import annotations

import argparse
import sys

from bench.peers.connect import PROFILES, PeerError, fetch_jars


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("command", choices=["fetch"])
    p.parse_args(argv)
    try:
        jars = fetch_jars()
    except PeerError as exc:
        print(f"bench.peers: {exc}", file=sys.stderr)
        return 1
    for profile in PROFILES:
        print(f"{profile}: {jars.lib(profile)} ({len(list(jars.lib(profile).glob('*.jar')))} jars)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

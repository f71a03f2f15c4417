"""Instructions per event of the relay's own per-event work beside the bare relay's (callgrind).

Run: `.venv/bin/python -m bench.instructions [--variant 20kb] [--events 50,150] [--top 12]`
(valgrind must be installed; each child runs about 50 times slower under it).

CPU time per event moves with the machine's other load; instruction counts do not. A child
process, under valgrind's callgrind, builds one getMore reply of N raw change events of the
payload variant (bench.events) and processes it twice as each contestant does: the relay (the
reply decoded as relay.mongo.codecs decodes it, the compiled reader's values, the message builder's
`build_many`) and the bare relay (each change's `fullDocument` bytes and `aggregateId`, as
bench/scenarios/bare_relay.py takes them); a third child only builds the reply, which is
subtracted. Two sizes of N: their difference, per event processed, leaves out start-up and imports. librdkafka's work (copying, lz4) is the same for both and is not
in it. Prints each contestant's instructions per event and the functions that take most.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROUNDS = 2  # each child processes its reply this many times
LINE = re.compile(r"\s*([\d,]+) \([ \d.]+%\)\s+(.*)$")


def child(contestant: str, events: int, variant_key: str) -> None:
    """Build the reply (set-up, the same in both children), then process it ROUNDS times."""
    import bson

    from bench.events import variants
    from bench.scenarios.bare_relay import RAW
    from relay.config import Settings
    from relay.mongo.codecs import RAW_CHANGE_CODEC, read_changes
    from relay.wiring import message_builder

    variant = next(v for v in variants(events, 200, True, True) if v.key == variant_key)
    factory = variant.factory()
    changes = [{"_id": {"_data": f"826B02209A000000012B042C0100296E5A1004{i:08X}"}, "operationType": "insert",
                "clusterTime": bson.Timestamp(0x6B02209A, i + 1), "wallTime": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
                "fullDocument": factory.event(i).to_document()} for i in range(events)]
    reply = bson.encode({"cursor": {"nextBatch": changes, "id": bson.Int64(5), "ns": "app.outbox",
                                    "postBatchResumeToken": {"_data": "82FF"}}, "ok": 1.0})
    builder = message_builder(Settings())

    def relay() -> Any:
        raw = list(bson.decode(reply, RAW_CHANGE_CODEC)["cursor"]["nextBatch"])
        values, _ = read_changes(raw)
        return builder.build_many(values, 1)

    def bare() -> Any:
        return [(bytes(c["fullDocument"].raw), c["fullDocument"]["aggregateId"].encode())
                for c in bson.decode(reply, RAW)["cursor"]["nextBatch"]]

    work = {"relay": relay, "bare": bare, "set-up": lambda: None}[contestant]
    for _ in range(ROUNDS):
        work()


def counts(contestant: str, events: int, variant: str, folder: Path) -> dict[str, int]:
    """Instructions by function (callgrind_annotate's table) of one child run."""
    out = folder / f"{contestant}.{events}.callgrind"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
                    "bench.instructions", "--child", contestant, str(events), variant],
                   check=True, capture_output=True)
    table = subprocess.run(["callgrind_annotate", str(out)], check=True, capture_output=True, text=True).stdout
    found: dict[str, int] = {}
    for line in table.splitlines():
        m = LINE.match(line)
        if m:
            found[m.group(2).strip()] = int(m.group(1).replace(",", ""))
    return found


def per_event(contestant: str, sizes: tuple[int, int], variant: str, folder: Path) -> dict[str, float]:
    """Instructions per event processed, by function: the difference of the two sizes."""
    small, large = (counts(contestant, n, variant, folder) for n in sizes)
    encoded = (sizes[1] - sizes[0]) * ROUNDS
    return {k: (large.get(k, 0) - small.get(k, 0)) / encoded for k in set(small) | set(large)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="20kb", choices=["default", "2kb", "20kb", "typed"])
    p.add_argument("--events", default="50,150", help="the two reply sizes N (default 50,150)")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--child", nargs=3, metavar=("CONTESTANT", "N", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return 0
    if shutil.which("valgrind") is None:
        p.error("valgrind is not installed")
    small, large = (int(x) for x in args.events.split(","))
    folder = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    try:
        results = {c: per_event(c, (small, large), args.variant, folder) for c in ("set-up", "relay", "bare")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    setup = results.pop("set-up")
    print(f"instructions per event, {args.variant} payload (callgrind; replies of {small} and {large} events, "
          f"each processed {ROUNDS} times; building the reply, measured alone, subtracted)")
    for c, r in results.items():
        own = {k: v - setup.get(k, 0.0) for k, v in r.items()}
        print(f"  {c}: {own.pop('PROGRAM TOTALS', 0.0):,.0f} per event; top functions:")
        for name, value in sorted(own.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"    {value:>10,.0f}  {name[-110:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

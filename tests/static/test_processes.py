"""Every process the project's code starts goes through `relay.dev.processes.spawn`, so it dies with
the process that started it (relay.dev.reaper; docs/testing.md, "Servers die with their test")."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

# Children their starter waits for before it goes on (nothing can outlive it but by a crash of the
# test itself): a bench harness test's short-lived process tree.
_WAITED_FOR = {"tests/unit/test_bench_harness.py"}
_OWN = {"relay/dev/processes.py", "relay/dev/reaper.py"}
# A child started another way: subprocess's Popen, or multiprocessing's (its own fork and exec).
_STARTS = re.compile(r"\bPopen\(|\bmultiprocessing\b.*\b(Process|get_context|Pool)\b|\bget_context\(")


def test_no_process_is_started_but_through_spawn():
    found = []
    for folder in ("relay", "harness", "tests", "bench", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name in _OWN | _WAITED_FOR:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _STARTS.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{name}:{n}: {line.strip()}")
    assert not found, "start processes with relay.dev.processes.spawn:\n" + "\n".join(found)

"""Tests observe the shared change stream through what it offers (`SharedStream.read_to`,
`Subscription.queued`, the mailbox's methods), never through its private fields: those belong to
the thread that owns them (relay/mongo/shared_reader.py's "Who owns what"), and a test reading
them would pin the reader's insides instead of its behaviour."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

# The modules of the shared stream whose private state the tests must not read.
STREAM = ("relay/mongo/shared_reader.py", "relay/mongo/mailbox.py", "relay/mongo/subscription.py")


def _assigned(path: str) -> set[str]:
    """Every `self._name` the module at `path` assigns."""
    return set(re.findall(r"\bself\.(_[a-z]\w*)\s*(?::[^=\n]*)?=", (ROOT / path).read_text()))


def _private_fields() -> set[str]:
    """The private state of the stream's objects: what its modules assign and no other module of
    the relay does (a `_lock` or a `_thread` could be anyone's)."""
    others = {p.relative_to(ROOT).as_posix() for p in (ROOT / "relay").rglob("*.py")} - set(STREAM)
    return set().union(*map(_assigned, STREAM)) - set().union(*map(_assigned, others))


def test_no_test_reads_the_private_state_of_the_shared_stream():
    fields = _private_fields()
    assert {"_position", "_member", "_members"} <= fields, fields  # what the scan must find
    reads = re.compile(r"(?<!self)\.(" + "|".join(sorted(fields)) + r")\b")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found, "read the stream through its public properties:\n" + "\n".join(found)

"""What each path imports: the writer and the inbox need no compiled code, and nothing a service,
`outbox-relay run` or another base-install command loads needs an extra (psutil: the dev stack
and the benchmarks; avro: `schemas check`; pyspark: the pipeline). Each check runs in a fresh
interpreter, so only the imports of the named modules count. tests/integration/test_packaging.py
checks the same in an environment where those packages are not installed at all.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

EXTRAS = {"psutil", "avro", "pyspark"}


def _loaded(*modules: str) -> set[str]:
    code = f"import sys; import {', '.join(modules)}; print(' '.join(sys.modules))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_the_writer_and_the_inbox_import_no_compiled_code_and_no_extra():
    loaded = _loaded("relay", "relay.outbox", "relay.inbox", "relay.inbox.inbox")
    assert "relay.outbox.writer" in loaded and "relay.inbox.inbox" in loaded
    assert not (EXTRAS | {"relay._native"}) & loaded


@pytest.mark.parametrize("modules", [
    ("relay.cli",),
    ("relay.wiring", "relay.config"),
    # The other commands of the base install: status, checkpoint reset, tail, outbox, security.
    ("relay.commands.status", "relay.commands.tail", "relay.commands.outbox", "relay.commands.security"),
])
def test_the_relay_imports_no_extra(modules):
    loaded = _loaded(*modules)
    assert not EXTRAS & loaded, EXTRAS & loaded


def test_the_check_would_see_an_extra():
    assert "psutil" in _loaded("relay.dev.stack")

"""The README's code snippets are the files tests/integration/test_readme_snippets.py runs
(docs/snippets/, copied in by tools/readme_snippets.py), so a snippet cannot drift from code that
works."""

from __future__ import annotations

import re

from tests.support.paths import ROOT
from tools.readme_snippets import marked_blocks

SNIPPETS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "snippets").glob("*.py"))


def test_every_marked_readme_block_is_its_snippet_file_verbatim():
    blocks = marked_blocks((ROOT / "README.md").read_text())
    assert blocks, "the README marks its snippets"
    stale = [path for path, code in blocks if (ROOT / path).read_text() != code]
    assert stale == [], f"run: python tools/readme_snippets.py ({stale})"


def test_every_snippet_file_is_shown_and_the_service_snippets_are_among_them():
    shown = {path for path, _ in marked_blocks((ROOT / "README.md").read_text())}
    assert shown == set(SNIPPETS)
    assert {"docs/snippets/outbox.py", "docs/snippets/async_outbox.py", "docs/snippets/inbox.py",
            "docs/snippets/async_inbox.py"} <= shown


def test_the_readme_python_blocks_that_import_relay_are_snippets():
    """A ```python block using the package is either a snippet (runs in the tests) or none at all."""
    text = (ROOT / "README.md").read_text()
    unmarked = [m.group(1) for m in re.finditer(r"(?<!-->\n)```python\n(.*?)```", text, re.S)
                if re.search(r"^(from relay|import relay)", m.group(1), re.M)]
    assert unmarked == [], unmarked

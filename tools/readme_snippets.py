"""Copy the runnable snippets of docs/snippets/ into README.md's code blocks.

A README block that shows a snippet is marked by a comment naming its file, right before its
fence:

    <!-- snippet: docs/snippets/inbox.py -->
    ```python
    ...the file's text...
    ```

`python tools/readme_snippets.py` rewrites every marked block from its file; `--check` changes
nothing and exits 1 naming the blocks that differ (tests/static/test_readme_snippets.py runs the
same comparison; tests/integration/test_readme_snippets.py runs the files against real servers).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKED = re.compile(r"(<!-- snippet: (?P<path>[\w./-]+) -->\n```python\n)(?P<code>.*?)(```)", re.S)


def marked_blocks(text: str) -> list[tuple[str, str]]:
    """(file, the block's code) for every marked block of `text`, in order."""
    return [(m["path"], m["code"]) for m in MARKED.finditer(text)]


def current(text: str) -> str:
    """`text` with every marked block replaced by its file's text."""
    return MARKED.sub(lambda m: m.group(1) + (ROOT / m["path"]).read_text() + m.group(4), text)


def main(argv: list[str]) -> int:
    text = README.read_text()
    new = current(text)
    if "--check" in argv:
        stale = [path for path, code in marked_blocks(text) if (ROOT / path).read_text() != code]
        for path in stale:
            print(f"README.md's block of {path} differs from the file: run python tools/readme_snippets.py")
        return 1 if stale else 0
    README.write_text(new)
    print("README.md snippets", "updated" if new != text else "already current")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Rewrite README.md's configuration table from relay/config/ (the settings table) (`make docs`)."""

from __future__ import annotations

import re
from pathlib import Path

from relay.config import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"

text = README.read_text()
new = re.sub(r"(<!-- settings-table -->\n).*?(\n<!-- /settings-table -->)",
             lambda m: m.group(1) + markdown_table() + m.group(2), text, flags=re.S)
README.write_text(new)
print("README.md settings table", "updated" if new != text else "already current")

"""What the README and docs/ name exists: every file path, `relay.` module and test they cite
(so a move or a rename cannot leave a page pointing at nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "BENCHMARKS.md",
    ROOT / "schemas" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
# Named before they exist: the first superseded schema version creates history/, a benchmark run
# writes its results.
NOT_YET = {"schemas/history/", "bench/results/latest.json"}
# Dotted names that are loggers, not modules (README, "Logs").
LOGGERS = {"relay.observe", "relay.summary"}
TEST_SOURCES = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))


def _cited(pattern: str) -> list[tuple[str, str]]:
    return [(page.name, m.group(1).rstrip(".")) for page in PAGES for m in re.finditer(pattern, page.read_text())]


def _module_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):  # relay.x.y may name an attribute of module relay.x
        path = ROOT.joinpath(*parts[:i])
        if (
            path.with_suffix(".py").exists()
            or (path / "__init__.py").exists()
            or any(path.parent.glob(f"{path.name}.*.so"))
        ):
            return True
    return False


@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_file_a_page_names_exists(page):
    cited = _cited(r"`((?:relay|tests|bench|tools|schemas|docs|native|deploy|\.ci)/[\w./\-]+)`")
    missing = [
        path for name, path in cited if name == Path(page).name and path not in NOT_YET and not (ROOT / path).exists()
    ]
    assert missing == []


def test_every_module_the_pages_name_exists():
    assert [
        (page, mod) for page, mod in _cited(r"`(relay(?:\.\w+)+)`") if mod not in LOGGERS and not _module_exists(mod)
    ] == []


def test_every_test_the_pages_name_exists():
    missing = [
        (page, name)
        for page, name in _cited(r"`(test_\w+)`")
        if not re.search(rf"def {name}\b", TEST_SOURCES) and not any((ROOT / "tests").rglob(f"{name}.py"))
    ]
    assert missing == []

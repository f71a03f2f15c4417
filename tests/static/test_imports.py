"""The boundaries between the checkout's folders: the benchmarks and the harness they share with
the tests (`harness/`) import nothing of `tests/`, the relay (`relay/`) imports nothing of the
three, and the wheel ships none of them (docs/architecture.md; the relay's own layers are
import-linter's, pyproject.toml)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import ROOT

# Who may not import whom: each folder of the checkout, and the top-level packages it must not import.
FORBIDDEN = {
    "bench": {"tests"},
    "harness": {"tests", "bench"},
    "relay": {"tests", "bench", "harness"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports (absolute imports; relative ones stay in their package), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_a_folder_imports_nothing_it_must_not(folder: str) -> None:
    forbidden = FORBIDDEN[folder]
    found = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, module in _imports(path)
        if module.split(".")[0] in forbidden
    ]
    assert not found, f"{folder}/ imports {' or '.join(sorted(forbidden))}:\n" + "\n".join(found)


def test_the_wheel_ships_the_relay_alone() -> None:
    """The harness assumes a checkout (it starts the relay from it): it is not a package of the wheel."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert [p for p in packages if p.split(".")[0] not in ("relay", "relay_schemas")] == []
    assert not (ROOT / "relay" / "dev" / "harness").exists()

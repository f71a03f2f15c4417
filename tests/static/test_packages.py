"""Every package under relay/ is in the wheel: pyproject.toml lists the packages by name (a
subfolder left out installs as nothing, and the installed relay fails to import it)."""

from __future__ import annotations

import tomllib

from tests.support.paths import ROOT


def test_every_package_of_relay_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "relay").rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from [tool.setuptools] packages: {sorted(found - listed)}"

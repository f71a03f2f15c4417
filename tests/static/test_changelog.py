"""The version, the changelog and the README's release facts agree (issue 42, "docs that cannot
drift"): pyproject's version is `relay.__version__`, what `outbox-relay --version` prints and the
newest entry of CHANGELOG.md (Keep a Changelog), plus `+dev` while [Unreleased] lists changes
(issue 54); the README names the built wheel and sdist with
a glob that matches the names the build gives; the suite's figures live in docs/testing.md only."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib

import relay
from tests.support.paths import ROOT
from tools import build_wheel

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
README = (ROOT / "README.md").read_text()
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_package_version_is_the_changelogs_newest_plus_dev_while_unreleased_changes_wait():
    """A build between releases says so: with entries under [Unreleased] the version is the newest
    release's plus `+dev`; right after a release (nothing under [Unreleased]) it is the release's."""
    releases = RELEASE.findall(CHANGELOG)
    assert releases, "CHANGELOG.md has `## [x.y.z] - YYYY-MM-DD` entries"
    unreleased = CHANGELOG.partition("## [Unreleased]")[2].partition("\n## [")[0]
    expected = releases[0][0] + ("+dev" if re.search(r"^- ", unreleased, re.M) else "")
    assert VERSION == relay.__version__ == expected
    printed = subprocess.run([sys.executable, "-m", "relay", "--version"], capture_output=True, text=True,
                             cwd=ROOT, check=True).stdout.strip()
    assert printed == f"outbox-relay {expected}"


def test_the_changelog_is_in_keep_a_changelog_form():
    assert CHANGELOG.startswith("# Changelog\n") and "keepachangelog.com" in CHANGELOG
    versions = [tuple(int(n) for n in v.split(".")) for v, _ in RELEASE.findall(CHANGELOG)]
    dates = [d for _, d in RELEASE.findall(CHANGELOG)]
    assert versions == sorted(versions, reverse=True) and dates == sorted(dates, reverse=True), "newest first"
    headings = re.findall(r"^## (.*)$", CHANGELOG, re.M)
    assert all(h == "[Unreleased]" or RELEASE.match(f"## {h}") for h in headings), headings
    assert set(re.findall(r"^### (.*)$", CHANGELOG, re.M)) <= SECTIONS


def test_the_readme_names_the_built_files_by_a_glob_their_names_match():
    """`pip install dist/outbox_relay-*_$(uname -m).whl` works in a shell after `make dist`
    (tools/build_wheel.py leaves one build's wheel per machine in dist/): on each machine the glob
    matches the name built from pyproject's version and the tags the build gives for it, in either
    order auditwheel writes them, and not the other machine's."""
    installs = re.findall(r"pip install ([^\s`]*outbox_relay[^\s`]*)", README)
    assert set(installs) == {"dist/outbox_relay-*_$(uname", "dist/outbox_relay-*.tar.gz"}, installs
    assert "pip install dist/outbox_relay-*_$(uname -m).whl" in README
    assert 'pip install "$(echo dist/outbox_relay-*_$(uname -m).whl)[dev]"' in README, "the wheel with an extra"
    for machine, (_target, policy) in build_wheel.ARCHES.items():
        pattern = f"dist/outbox_relay-*_{machine}.whl"  # what the shell makes of the README's glob
        tags = (f"manylinux2014_{machine}", policy)
        for platforms in (".".join(tags), ".".join(reversed(tags))):
            assert fnmatch.fnmatch(f"dist/outbox_relay-{VERSION}-cp311-abi3-{platforms}.whl", pattern)
        other = next(m for m in build_wheel.ARCHES if m != machine)
        assert not fnmatch.fnmatch(f"dist/outbox_relay-{VERSION}-cp311-abi3-manylinux2014_{other}.whl", pattern)
    assert fnmatch.fnmatch(f"dist/outbox_relay-{VERSION}.tar.gz", "dist/outbox_relay-*.tar.gz")
    assert not re.search(r"outbox_relay-\d", README), "no version written into a file name"


def test_the_suites_figures_have_one_source():
    assert not re.search(r"\b\d[\d,]* tests\b", README), "the README links docs/testing.md instead"
    assert "docs/testing.md" in README
    assert re.search(r"\b\d[\d,]* tests passed\b", (ROOT / "docs" / "testing.md").read_text())
    assert "What changed in" not in README, "release notes live in CHANGELOG.md"

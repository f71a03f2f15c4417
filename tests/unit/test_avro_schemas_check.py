"""`outbox-relay schemas check`: parse, envelope rules, compatibility against a baseline (a folder,
or the previous version committed in git), history kept for changed schemas."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relay.avro.schemas_check import run
from relay.core.errors import EXIT_DATA

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
TYPED = "events/OrderCreated.avsc"


def copy_schemas(dest: Path) -> Path:
    shutil.copytree(SCHEMAS, dest, ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.md"))
    return dest


def edit(folder: Path, path: str, change: Callable[[dict[str, Any]], None]) -> None:
    schema = json.loads((folder / path).read_text())
    change(schema)
    (folder / path).write_text(json.dumps(schema, indent=2))


def payload_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return next(f for f in schema["fields"] if f["name"] == "payload")["type"]["fields"]


def check(folder: Path, **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run(folder, out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    return copy_schemas(tmp_path / "baseline"), copy_schemas(tmp_path / "schemas")


def test_unchanged_schemas_pass(folders):
    baseline, current = folders
    assert check(current, baseline_dir=baseline)[0] == 0


def test_removing_a_required_field_fails_naming_the_field(folders):
    baseline, current = folders
    edit(current, TYPED, lambda s: payload_fields(s).pop())  # drops payload.step
    code, _, err = check(current, baseline_dir=baseline, keep_history=True)
    assert code == EXIT_DATA
    assert f"error: {TYPED}: breaking change" in err
    assert "consumers on the previous schema cannot read messages written with the new one" in err
    assert "field payload.step" in err


def test_adding_an_optional_field_passes_and_keeps_the_previous_version_in_history(folders):
    baseline, current = folders
    edit(current, TYPED, lambda s: payload_fields(s).append(
        {"name": "couponCode", "type": ["null", "string"], "default": None}))
    code, _, err = check(current, baseline_dir=baseline)
    assert code == EXIT_DATA and "is not kept" in err and "--keep-history" in err and "breaking" not in err
    code, out, err = check(current, baseline_dir=baseline, keep_history=True)
    assert code == 0, err
    kept = list((current / "history").glob("io.outboxrelay.v1.events.OrderCreated.*.avsc"))
    assert len(kept) == 1 and f"{TYPED}: kept the baseline" in out
    assert check(current, baseline_dir=baseline)[0] == 0  # history now holds it


@pytest.mark.parametrize("change, fragment", [
    (lambda s: payload_fields(s).append({"name": "channel", "type": "string"}),
     "the new schema cannot read messages written with the previous one: field payload.channel"),
    (lambda s: payload_fields(s)[2].update(type="string"), "field payload.step: type mismatch"),
    (lambda s: payload_fields(s)[2].update(type="long"), "consumers on the previous schema"),
    (lambda s: payload_fields(s)[1].update(type={"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}),
     "field payload.amount: type mismatch"),
    (lambda s: s.update(name="OrderOpened"), "name mismatch"),
])
def test_incompatible_changes_fail_naming_the_field(folders, change, fragment):
    baseline, current = folders
    edit(current, TYPED, change)
    code, _, err = check(current, baseline_dir=baseline, keep_history=True)
    assert code == EXIT_DATA and fragment in err, err


def test_a_changed_decimal_scale_fails_although_the_bytes_stay_readable(folders):
    baseline, current = folders
    dec = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
    for folder in folders:
        edit(folder, TYPED, lambda s: payload_fields(s).append({"name": "tax", "type": dict(dec), "default": "\u0000"}))
    edit(current, TYPED, lambda s: payload_fields(s)[-1]["type"].update(scale=3))
    code, _, err = check(current, baseline_dir=baseline, keep_history=True)
    assert code == EXIT_DATA and "field payload.tax: logical type changed from decimal(9,2) on bytes to decimal(9,3)" in err


def test_removing_a_schema_file_fails(folders):
    baseline, current = folders
    (current / TYPED).unlink()
    code, _, err = check(current, baseline_dir=baseline)
    assert code == EXIT_DATA and f"{TYPED}: removed" in err and "OrderCreated" in err


@pytest.mark.parametrize("path, text, fragment", [
    ("events/Broken.avsc", "{not json", "not valid JSON"),
    ("events/Broken.avsc", '{"type": "record", "name": "B", "fields": [{"name": "x", "type": "nope"}]}',
     "not a valid Avro schema"),
    ("Extra.avsc", '{"type": "record", "name": "Extra", "fields": []}', "only io.outboxrelay.v1.OutboxEvent lives"),
])
def test_files_that_do_not_parse_or_break_the_layout_fail(folders, path, text, fragment):
    baseline, current = folders
    (current / path).write_text(text)
    code, _, err = check(current, baseline_dir=baseline)
    assert code == EXIT_DATA and path in err and fragment in err, err


def test_typed_envelope_rules_are_enforced(folders):
    baseline, current = folders
    typed = json.loads((current / TYPED).read_text())
    no_type = dict(typed, name="NoType")
    no_type.pop("eventType")
    (current / "events/NoType.avsc").write_text(json.dumps(no_type))
    (current / "events/Twice.avsc").write_text(json.dumps(dict(typed, name="Twice")))
    unsupported = json.loads(json.dumps(typed))
    unsupported.update(name="Clock", eventType="Clock")
    payload_fields(unsupported)[0]["type"] = {"type": "int", "logicalType": "time-millis"}
    (current / "events/Clock.avsc").write_text(json.dumps(unsupported))
    code, _, err = check(current, baseline_dir=baseline)
    assert code == EXIT_DATA
    assert "events/NoType.avsc: a typed envelope needs a top-level \"eventType\"" in err
    assert "events/Twice.avsc: event type 'OrderCreated' already has a schema" in err
    assert "events/Clock.avsc: field 'payload.orderId': logical type 'time-millis' on int has no BSON mapping" in err


def test_history_files_must_be_named_for_their_fingerprint_and_never_removed(folders):
    baseline, current = folders
    (current / "history").mkdir()
    shutil.copy(current / TYPED, current / "history" / "wrong-name.avsc")
    code, _, err = check(current, baseline_dir=baseline)
    assert code == EXIT_DATA and "a history file must be named history/io.outboxrelay.v1.events.OrderCreated." in err
    (baseline / "history").mkdir()
    (baseline / "history" / "old.avsc").write_text((baseline / TYPED).read_text())
    assert "history files are never removed" in check(current, baseline_dir=baseline)[2]


# ---- git baselines -------------------------------------------------------------------------------

def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    copy_schemas(repo / "schemas")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "schemas")
    return repo


def test_git_baseline_is_the_previous_committed_version_also_after_the_change_is_committed(repo):
    schemas = repo / "schemas"
    assert check(schemas)[0] == 0
    edit(schemas, TYPED, lambda s: payload_fields(s).pop())
    code, _, err = check(schemas, keep_history=True)
    assert code == EXIT_DATA and "previous committed version" in err and "field payload.step" in err
    git(repo, "commit", "-q", "-am", "break it")
    code, _, err = check(schemas)  # a clean checkout of the breaking commit still fails
    assert code == EXIT_DATA and "field payload.step" in err


def test_git_baseline_accepts_a_compatible_change_once_history_is_kept(repo):
    schemas = repo / "schemas"
    edit(schemas, TYPED, lambda s: payload_fields(s).append({"name": "note", "type": ["null", "string"], "default": None}))
    assert check(schemas, keep_history=True)[0] == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "optional field")
    assert check(schemas)[0] == 0
    (schemas / TYPED).unlink()
    code, _, err = check(schemas)
    assert code == EXIT_DATA and f"{TYPED}: removed" in err


def test_git_ref_baseline(repo):
    schemas = repo / "schemas"
    git(repo, "tag", "v1")
    edit(schemas, TYPED, lambda s: payload_fields(s).pop())
    git(repo, "commit", "-q", "-am", "break it")
    code, _, err = check(schemas, git_ref="v1", keep_history=True)
    assert code == EXIT_DATA and "version at v1" in err and "payload.step" in err


def test_the_repository_schemas_pass_the_check_run_as_ci_runs_it():
    result = subprocess.run([sys.executable, "-m", "relay", "schemas", "check"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "schemas check: ok" in result.stdout

"""`outbox-relay schemas check`: every schema parses, follows the envelope rules, and every change
is compatible with the previous version.

Checks, in order (all problems are reported, not only the first):
1. every `.avsc` is JSON and a valid Avro schema (fastavro, which writes the messages, and the
   Apache Avro parser, which checks compatibility);
2. the contract (`relay.avro.contract`): one generic envelope, typed envelopes under `events/` with
   the generic envelope's fields and an `eventType`, types the BSON mapping supports, unique names
   and event types, `history/` files named for their fingerprint;
3. against a baseline, each schema file that changed is compatible in BOTH directions (what
   Confluent calls FULL): the new schema reads messages written with the previous one
   (replays, new consumers) and consumers still on the previous schema read messages written
   with the new one (consumers exist and upgrade later). A removed schema file, a removed or
   added field without a default, a changed type or a changed logical type (decimal scale...)
   is breaking; adding a field with a default (an optional field) is not. A changed schema's
   previous version must be kept in `history/` so readers can still decode older messages
   (`--keep-history` writes it).

The baseline is, by default, each file's previous version committed in git (the newest commit
whose version of the file differs from the working tree's), plus HEAD for files deleted from the
working tree; `--git-ref REF` compares with the folder at REF (e.g. `origin/main` in a pull
request); `--baseline DIR` with a folder. The result: exit 0 when everything holds, 4 (`EXIT_DATA`)
naming each breaking file and field otherwise, 2 when the baseline cannot be read.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from relay.avro.contract import (
    HISTORY_DIR,
    SchemaError,
    SchemaFile,
    history_file_name,
    iter_texts,
    parse_file,
    problems_of,
)
from relay.core.errors import EXIT_DATA, EXIT_OK, ConfigError


@dataclass
class Report:
    """What the check found: problems (each fails the check) and informational lines."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem(self, file: str, message: str) -> None:
        self.problems.append(f"{file}: {message}" if file else message)

    def note(self, message: str) -> None:
        self.notes.append(message)


# ---- baselines ---------------------------------------------------------------------------------


def default_folder() -> Path:
    """The schema folder of this installation (the repository's `schemas/` in a dev install)."""
    return Path(str(resources.files("relay_schemas")))


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError("schemas check", f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _repo_of(folder: Path) -> tuple[Path, str]:
    try:
        root = Path(_git(folder, "rev-parse", "--show-toplevel").strip())
    except ConfigError as exc:
        raise ConfigError(
            "schemas check",
            f"{folder} is not in a git work tree; pass --baseline DIR (a folder with the previous schemas)",
        ) from exc
    return root, folder.resolve().relative_to(root.resolve()).as_posix()


def _strip_docs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_docs(v) for k, v in node.items() if k != "doc"}
    if isinstance(node, list):
        return [_strip_docs(v) for v in node]
    return node


def signature(schema: Mapping[str, Any]) -> str:
    """What a change is judged on: the schema without docs. (The parsing canonical form would
    also drop logical types, so a changed decimal scale would look unchanged.)"""
    return json.dumps(_strip_docs(schema), sort_keys=True)


def _signature_of(text: str) -> str | None:
    try:
        return signature(json.loads(text))
    except ValueError:
        return None


def baseline_from_dir(folder: Path) -> dict[str, str]:
    """relative path -> text of every schema under `folder`."""
    return dict(iter_texts(folder))


def baseline_from_git_ref(folder: Path, ref: str) -> dict[str, str]:
    """relative path -> text of every schema in `folder` as it is at git `ref`."""
    root, rel = _repo_of(folder)
    names = _git(root, "ls-tree", "-r", "--name-only", ref, "--", rel).split()
    return {
        PurePosixPath(n).relative_to(rel).as_posix(): _git(root, "show", f"{ref}:{n}")
        for n in names
        if n.endswith(".avsc")
    }


def baseline_previous_commits(folder: Path, current: Mapping[str, str]) -> tuple[dict[str, str], set[str]]:
    """For each current schema, its newest committed version that differs from it; and the HEAD
    version of every schema deleted from the working tree. Also: the paths git has a history of."""
    root, rel = _repo_of(folder)
    out: dict[str, str] = {}
    known: set[str] = set()
    for path, text in current.items():
        if PurePosixPath(path).parts[0] == HISTORY_DIR:
            continue
        repo_path = f"{rel}/{path}" if rel != "." else path
        mine = _signature_of(text)
        commits = _git(root, "log", "--format=%H", "--", repo_path).split()
        if commits:
            known.add(path)
        for sha in commits:
            try:
                old = _git(root, "show", f"{sha}:{repo_path}")
            except ConfigError:
                continue  # the commit deleted the file
            if _signature_of(old) != mine:
                out[path] = old
                break
    head = baseline_from_git_ref(folder, "HEAD") if _has_head(root) else {}
    out.update({p: t for p, t in head.items() if p not in current})
    return out, known | set(out)


def _has_head(root: Path) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, check=False
        ).returncode
        == 0
    )


# ---- compatibility -----------------------------------------------------------------------------


def _field_path(schema: Any, location: str) -> str:
    """A checker location (`/fields/5/type/fields/1`) as a field path (`payload.amount`)."""
    parts = [p for p in location.split("/") if p]
    node, names, i = schema, [], 0
    while i < len(parts):
        part = parts[i]
        if part == "fields" and i + 1 < len(parts) and isinstance(node, dict):
            f = node["fields"][int(parts[i + 1])]
            names.append(f["name"])
            node, i = f, i + 2
        elif part == "type" and isinstance(node, dict):
            node, i = node["type"], i + 1
        elif part in ("items", "values") and isinstance(node, dict):
            if names:
                names[-1] += "[]" if part == "items" else "{}"
            node, i = node[part], i + 1
        elif part.isdigit() and isinstance(node, list):
            node, i = node[int(part)], i + 1
        else:
            break
    return ".".join(names) or "(the record itself)"


def _deepest(locations: set[str]) -> list[str]:
    locs = {loc for loc in locations if loc not in ("", "/")}
    return sorted(loc for loc in locs if not any(o != loc and o.startswith(loc + "/") for o in locs))


def _incompatibilities(reader: Mapping[str, Any], writer: Mapping[str, Any]) -> list[str]:
    result = ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.parse(json.dumps(reader)), avro.schema.parse(json.dumps(writer))
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted({i.value.replace("_", " ") for i in result.incompatibilities}))
    details = "; ".join(sorted(result.messages))
    paths = ", ".join(_field_path(reader, loc) for loc in _deepest(result.locations)) or "(the record itself)"
    return [f"field {paths}: {kinds} ({details})"]


def _logical_types(schema: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(field path, logical type signature) of every logical type in `schema`'s JSON."""
    if isinstance(schema, list):
        for branch in schema:
            yield from _logical_types(branch, path)
        return
    if not isinstance(schema, dict):
        return
    if "logicalType" in schema:
        signature = f"{schema['logicalType']} on {schema['type']}"
        if schema["logicalType"] == "decimal":
            signature = f"decimal({schema.get('precision')},{schema.get('scale', 0)}) on {schema['type']}"
        yield path, signature
    kind = schema.get("type")
    if kind == "record":
        for f in schema.get("fields", []):
            yield from _logical_types(f["type"], f"{path}.{f['name']}" if path else f["name"])
    elif kind == "array":
        yield from _logical_types(schema["items"], path + "[]")
    elif kind == "map":
        yield from _logical_types(schema["values"], path + "{}")
    elif isinstance(kind, (dict, list)):
        yield from _logical_types(kind, path)


def _logical_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    before: dict[str, set[str]] = {}
    after: dict[str, set[str]] = {}
    for p, sig in _logical_types(old):
        before.setdefault(p, set()).add(sig)
    for p, sig in _logical_types(new):
        after.setdefault(p, set()).add(sig)
    return [
        f"field {p}: logical type changed from {', '.join(sorted(before[p]))} to "
        f"{', '.join(sorted(after[p]))} (the same bytes would mean another value)"
        for p in sorted(before.keys() & after.keys())
        if before[p] != after[p]
    ]


def breaking_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Why messages cannot flow between the two versions, in either direction; empty if they can."""
    problems = [
        f"the new schema cannot read messages written with the previous one: {m}" for m in _incompatibilities(new, old)
    ]
    problems += [
        f"consumers on the previous schema cannot read messages written with the new one: {m}"
        for m in _incompatibilities(old, new)
    ]
    return problems + _logical_changes(old, new)


# ---- the check -----------------------------------------------------------------------------------


def check(
    folder: Path,
    baseline: Mapping[str, str] | None,
    baseline_label: str,
    keep_history: bool = False,
    known: set[str] | None = None,
) -> Report:
    """Check `folder` (and its changes against `baseline`: relative path -> text; `known`: the
    paths the baseline has, changed or not, default the baseline's keys)."""
    report = Report()
    texts = dict(iter_texts(folder))
    files = _parsed(texts, report)
    for file, problem in problems_of(files):
        report.problem(file, problem)
    for f in files:
        if f.historical and PurePosixPath(f.path).name != PurePosixPath(history_file_name(f)).name:
            report.problem(
                f.path,
                f"a history file must be named {history_file_name(f)} (its full name "
                "and fingerprint); history files are never edited",
            )
    against = _Baseline(folder, texts, {f.path: f for f in files}, baseline_label, keep_history, report)
    for path, old_text in sorted((baseline or {}).items()):
        against.compare(path, old_text)
    known = set(baseline or {}) if known is None else known
    for f in files:
        if not f.historical and f.path not in known:
            report.note(f"{f.path}: new ({f.name}, fingerprint {f.fingerprint.hex()})")
    report.note(f"{len(files)} schema files checked in {folder} against the {baseline_label}")
    return report


def _parsed(texts: Mapping[str, str], report: Report) -> list[SchemaFile]:
    """The schema files that parse (by the relay's rules and by the Apache Avro parser); the
    others are reported."""
    files: list[SchemaFile] = []
    for path, text in texts.items():
        try:
            f = parse_file(path, text)
            avro.schema.parse(text)
        except SchemaError as exc:
            report.problem(path, str(exc).split(": ", 1)[-1])
            continue
        except Exception as exc:  # noqa: BLE001 - the Apache Avro parser's many error types
            report.problem(path, f"the Apache Avro parser refuses it: {exc}")
            continue
        files.append(f)
    return files


@dataclass
class _Baseline:
    """Compares each baseline file with the folder: history files are never removed, a schema
    is never removed, a change is compatible both ways, and the old version of a compatible
    change is kept in history/ (written with `keep_history`)."""

    folder: Path
    texts: Mapping[str, str]
    by_path: Mapping[str, SchemaFile]
    label: str
    keep_history: bool
    report: Report
    kept: set[bytes] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.kept = {f.fingerprint for f in self.by_path.values()}

    def compare(self, path: str, old_text: str) -> None:
        if PurePosixPath(path).parts[0] == HISTORY_DIR:
            if path not in self.texts:
                self.report.problem(
                    path,
                    f"removed, but it is in the {self.label}: history files are "
                    "never removed (readers need them to decode older messages)",
                )
            return
        try:
            old = parse_file(path, old_text)
        except SchemaError:
            self.report.note(f"{path}: the {self.label} version does not parse; not compared")
            return
        new = self.by_path.get(path)
        if new is None:
            if path not in self.texts:  # else it does not parse now: reported already
                self.report.problem(
                    path,
                    f"removed, but it is in the {self.label}: messages of "
                    f"{old.event_type or old.name} would change schema (breaking); keep it",
                )
            return
        if signature(new.raw) != signature(old.raw):
            self._changed(path, old, new, old_text)

    def _changed(self, path: str, old: SchemaFile, new: SchemaFile, old_text: str) -> None:
        breaking = breaking_changes(old.raw, new.raw)
        for problem in breaking:
            self.report.problem(path, f"breaking change against the {self.label}: {problem}")
        if breaking:
            return
        self.report.note(f"{path}: compatible with the {self.label}")
        if old.fingerprint in self.kept:
            return
        if not self.keep_history:
            self.report.problem(
                path,
                f"changed, but the {self.label} version (fingerprint "
                f"{old.fingerprint.hex()}) is not kept: readers need it to decode messages "
                f"already written; run `outbox-relay schemas check --keep-history` "
                f"to add {history_file_name(old)}",
            )
            return
        target = self.folder / history_file_name(old)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(old_text)
        self.kept.add(old.fingerprint)
        self.report.note(f"{path}: kept the {self.label} version as {history_file_name(old)}")


def run(
    folder: Path | None = None,
    baseline_dir: Path | None = None,
    git_ref: str | None = None,
    keep_history: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The command: print notes to `out`, problems to `err`; return the exit code."""
    import sys

    out = out or sys.stdout
    err = err or sys.stderr
    folder = (folder or default_folder()).resolve()
    known: set[str] | None = None
    if baseline_dir is not None:
        baseline, label = baseline_from_dir(baseline_dir), f"baseline {baseline_dir}"
    elif git_ref is not None:
        baseline, label = baseline_from_git_ref(folder, git_ref), f"version at {git_ref}"
    else:
        baseline, known = baseline_previous_commits(folder, dict(iter_texts(folder)))
        label = "previous committed version"
    report = check(folder, baseline, label, keep_history, known)
    for line in report.notes:
        print(line, file=out)
    for line in report.problems:
        print(f"error: {line}", file=err)
    if report.problems:
        print(f"schemas check: {len(report.problems)} problem(s)", file=err)
        return EXIT_DATA
    print("schemas check: ok", file=out)
    return EXIT_OK

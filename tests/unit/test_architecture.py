"""The package's shape, checked on every run: the layers and the import rules (import-linter,
configured in pyproject.toml), no private attribute of a library read anywhere in relay/, and no
error raised without the cause it translates."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

RELAY = Path(__file__).resolve().parents[2] / "relay"

# Attributes with a leading underscore that are public API of their library, or our own.
ALLOWED_PRIVATE = {
    # librdkafka's error codes of its own (negative codes) are public constants of KafkaError.
    ("KafkaError", "_PARTITION_EOF"), ("KafkaError", "_FENCED"), ("KafkaError", "_ALL_BROKERS_DOWN"),
    ("KafkaError", "_MSG_TIMED_OUT"), ("KafkaError", "_PURGE_QUEUE"), ("KafkaError", "_GAPLESS_GUARANTEE"),
    ("super()", "_poll"),  # our own base class
    # PySpark has no public API to the driver JVM: the Parquet snapshots list and delete folders
    # through Hadoop's FileSystem, and the executor check silences log4j, through py4j.
    ("spark.sparkContext", "_jvm"), ("spark.sparkContext", "_jsc"),
}


def _private_reads() -> list[str]:
    found = []
    for path in sorted(RELAY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = ast.unparse(node.value)
                if owner not in ("self", "cls") and (owner, node.attr) not in ALLOWED_PRIVATE:
                    found.append(f"{path.relative_to(RELAY.parent)}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_the_import_rules_hold():
    """Layers, relay.core free of drivers and codecs, no import circles, the Spark jobs free of
    the dev tooling (lint-imports prints the broken contract)."""
    result = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                             "lint_imports_command()"], capture_output=True, text=True, cwd=RELAY.parent)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_architecture_page_draws_the_contracts_layers_in_order():
    """docs/architecture.md's drawing is the import-linter layers contract, top to bottom: the
    page cannot drift from the rule the build enforces."""
    root = RELAY.parent
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    page = (root / "docs" / "architecture.md").read_text()
    drawing = re.search(r"```\n(.*?)```", page, re.S)
    assert drawing is not None, "docs/architecture.md has no drawing of the layers"
    drawn = [re.split(r"\s{2,}", line.strip())[0] for line in drawing.group(1).splitlines() if line.strip()]
    assert drawn == [layer.replace("relay.", "") for layer in layers]


def test_no_private_attribute_of_a_library_is_read():
    assert _private_reads() == []


def test_translated_errors_keep_their_cause():
    """`raise ... from None` drops the driver's error a user needs; every translation keeps it."""
    offenders = [f"{p.relative_to(RELAY.parent)}:{n}" for p in sorted(RELAY.rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) if "from None" in line]
    assert offenders == []


def test_functions_stay_small():
    """No function in relay/ over 60 lines (docstring included), at most 5 over 40: a long one
    is split where its steps are, as the loop's are."""
    lengths = []
    for path in sorted(RELAY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lengths.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(RELAY.parent)}:{node.name}"))
    assert [where for n, where in lengths if n > 60] == []
    over_40 = sorted(where for n, where in lengths if n > 40)
    assert len(over_40) <= 5, over_40

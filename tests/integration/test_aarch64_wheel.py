"""The aarch64 wheel (relay.dev.aarch64): built on this x86_64 machine with Debian's rustc and its
aarch64 standard library, then installed into a virtual environment of Debian's arm64 Python 3.11
running under qemu-user, from PyPI's aarch64 wheels of its dependencies (constraints.txt). There,
as in test_packaging.py, a service writes orders with `Outbox.add`, `python -m relay run`
publishes them with the wheel's compiled module, and a shipping service consumes them with
`Inbox.run` (tests/packaged_service.py): every order's steps take effect once, in order, against
the session's (x86_64) servers.

Cost: the first build compiles the crate for aarch64 (about 3 minutes of CPU, then kept in the
cache's cargo-target-aarch64); the packages (about 150 MB of Debian's) are fetched once into the
cache. The dependencies' aarch64 wheels are installed under emulation (a venv and pip, about 1.5
minutes) once per Debian Python, constraints.txt and the wheel's Requires-Dist, into a cached
virtual environment (`Emulated.venv_with`); each run copies it and installs only the wheel built
now (`--no-deps --no-index`), so the wheel still installs and the compiled module is the wheel's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from relay.dev import aarch64, cached
from relay.dev.processes import spawn
from tests.support.paths import ROOT
from tests.support.relays import settings_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(1800)

AGGREGATES, STEPS = 4, 3
PYTHON_PATH_LINE = "relay._native is not installed"


@pytest.fixture(scope="module")
def emulated_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[aarch64.Emulated, Path, Path]:
    wheel = aarch64.build(tmp_path_factory.mktemp("dist-aarch64"))
    emulated = aarch64.emulated()
    dependencies = emulated.venv_with(cached.requires_dist(wheel), ROOT / "constraints.txt")
    python = cached.fresh_copy(dependencies, tmp_path_factory.mktemp("arm64") / "venv")
    # The wheel alone (its dependencies are the copy's); from outside the checkout and without
    # PYTHONPATH: pip must not take the checkout's package (its egg-info) for an installed one.
    subprocess.run(emulated.argv(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                 "--no-deps", "--no-index", str(wheel)),
                   check=True, capture_output=True, timeout=1200, env=emulated.environ(), cwd=python.parent)
    return emulated, python, wheel


def test_the_aarch64_wheel_is_tagged_for_glibc_2_17_on_aarch64(emulated_python):
    _, _, wheel = emulated_python
    _name, _version, python, abi, platforms = wheel.name.removesuffix(".whl").split("-")
    assert (python, abi) == ("cp311", "abi3")
    assert set(platforms.split(".")) == {"manylinux2014_aarch64", "manylinux_2_17_aarch64"}, wheel.name


def test_the_aarch64_wheel_serves_writer_relay_and_inbox_under_emulation(emulated_python, env, tmp_path):
    emulated, python, _ = emulated_python
    where = subprocess.run(emulated.argv(python, "-c", "import platform, relay._native; print(platform.machine())"),
                           capture_output=True, text=True, check=True, cwd=tmp_path, timeout=300,
                           env=emulated.environ()).stdout.strip()
    assert where == "aarch64"
    uri, bootstrap, database = env.servers.mongodb_uri, env.servers.kafka_bootstrap, env.settings.database
    service = str(ROOT / "tests" / "packaged_service.py")
    environ: dict[str, Any] = emulated.environ(
        {k: v for k, v in settings_env(env.settings).items() if k.startswith("RELAY_")})
    subprocess.run(emulated.argv(python, service, "write", uri, database, str(AGGREGATES), str(STEPS)),
                   check=True, cwd=tmp_path, env=environ, timeout=600)
    logs = {name: tmp_path / f"{name}.log" for name in ("relay", "inbox")}
    procs = []
    try:
        for name, argv in (("relay", emulated.argv(python, "-m", "relay", "run")),
                           ("inbox", emulated.argv(python, service, "consume", uri, database, env.topic(),
                                                   "shipping", bootstrap))):
            with logs[name].open("wb") as log:
                procs.append(spawn(argv, cwd=tmp_path, env=environ, stdout=log, stderr=subprocess.STDOUT))
        done = lambda: env.db.shipments.count_documents({"steps": {"$size": STEPS}}) == AGGREGATES  # noqa: E731
        wait_until(done, 300, f"{AGGREGATES} orders' {STEPS} steps in effect under emulation")
    finally:
        for proc in procs:
            proc.terminate()
        codes = [proc.wait(timeout=120) for proc in procs]
    assert codes == [0, 0], {name: log.read_text()[-3000:] for name, log in logs.items()}
    shipments = {d["_id"]: d["steps"] for d in env.db.shipments.find()}
    assert shipments == {f"o-{n}": list(range(1, STEPS + 1)) for n in range(AGGREGATES)}, "once each, in order"
    assert PYTHON_PATH_LINE not in logs["relay"].read_text(), "the relay runs the wheel's compiled module"

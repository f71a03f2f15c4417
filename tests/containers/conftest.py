"""Session fixtures of the container tests: an engine, its Docker API, the images.

The engine comes from tests.containers.engine (Docker when one works, else Debian's podman,
installed when possible); with none, every test here is skipped with the one-line reason. The
images are built by `make containers` (tests.containers.prepare) before pytest starts; the
fixtures only check that the store holds them as built from the current sources, and build them
when it does not (the container tests run alone after an edit); such a build's time and size go
to the terminal summary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.containers import bases
from tests.containers.engine import Engine, EngineUnavailable
from tests.containers.images import PIPELINE_IMAGE, RELAY_IMAGE, BuildFailed, Built, ensure

_BUILT: list[Built] = []


@pytest.fixture(scope="session")
def engine() -> Engine:
    try:
        return Engine.find()
    except EngineUnavailable as exc:
        pytest.skip(f"no container engine: {exc}")


@pytest.fixture(scope="session")
def build_args(engine: Engine) -> dict[str, str]:
    return bases.ensure_bases(engine)


@pytest.fixture(scope="session")
def docker_api(engine: Engine) -> Iterator[str]:
    """DOCKER_HOST for testcontainers and the Docker SDK (podman's service, stopped by pid)."""
    host, service = engine.serve()
    saved = {k: os.environ.get(k) for k in ("DOCKER_HOST", "TESTCONTAINERS_RYUK_DISABLED")}
    # Ryuk (the reaper) is an image from Docker Hub, which is not reachable here; each test
    # removes its own containers.
    os.environ.update(DOCKER_HOST=host, TESTCONTAINERS_RYUK_DISABLED="true")
    try:
        yield host
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if service is not None:
            service.stop()


def _built(engine: Engine, target: str, ref: str, args: dict[str, str]) -> str:
    try:
        built = ensure(engine, target, args)
    except BuildFailed as exc:
        pytest.fail(f"building the {target} image failed: {exc}", pytrace=False)
    if built is not None:
        _BUILT.append(built)
    return ref


@pytest.fixture(scope="session")
def relay_image(engine: Engine, build_args: dict[str, str], docker_api: str) -> str:
    return _built(engine, "relay", RELAY_IMAGE, build_args)


@pytest.fixture(scope="session")
def pipeline_image(engine: Engine, build_args: dict[str, str], docker_api: str) -> str:
    return _built(engine, "pipeline", PIPELINE_IMAGE, build_args)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for b in _BUILT:
        terminalreporter.write_line(f"image {b.ref}: built during the tests (not by `make containers`, or "
                                    f"the sources changed since) in {b.seconds:.0f} s, {b.size_mb:.0f} MB")

"""What the built images hold: the relay image has no compiler, no pip cache and no sources; the
pipeline image starts (its RELAY_CACHE_DIR is accepted) and materializes a topic."""

from __future__ import annotations

import json
import warnings

import docker
import pytest

from tests.containers.sidecar import container_env
from tests.spark.cluster import JAVA_TOOL_OPTIONS
from tests.spark.support import VIEW_COLLECTION, assert_view_equals_outbox, mongo_view, outbox_state, positions
from tests.support.relays import RelayThread
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import write_events

# `make containers` builds the images; run alone after an edit, the first test to need one
# builds it (cold: several minutes on a busy machine).
pytestmark = [pytest.mark.usefixtures("docker_api"), pytest.mark.timeout(1800)]

# Run inside the relay image as its user: what a compiler, pip's cache or the sources would leave.
_INVENTORY = r"""
import json, os, shutil
found = {"compilers": [c for c in ("gcc", "cc", "c++", "rustc", "cargo", "ld") if shutil.which(c)],
         "pip_caches": [], "sources": [p for p in ("/src", "/wheels", "/opt/wheel-build") if os.path.exists(p)]}
for top in ("/root", "/home", "/opt", "/tmp", "/var", "/usr"):
    for folder, dirs, files in os.walk(top, onerror=lambda e: None):
        if folder.endswith(("/.cache/pip", "/pip/http", "/pip/wheels")):
            found["pip_caches"].append(folder)
        found["sources"] += [os.path.join(folder, f) for f in files
                             if f.endswith(".rs") or f in ("Cargo.toml", "Cargo.lock", "pyproject.toml")]
print(json.dumps(found))
"""


def _run(image: str, *argv: str, timeout: float = 600, **kwargs) -> bytes:
    """Run a container to its end and return its output (stdout; stderr too when asked). Detached,
    so it is removed whatever happens: an error, its own timeout or pytest-timeout's."""
    client = docker.from_env()
    container = None
    try:
        container = client.containers.run(image, list(argv), network_mode="host", detach=True, **kwargs)
        status = container.wait(timeout=timeout)
        stderr = bool(kwargs.get("stderr"))
        output = bytes(container.logs(stdout=True, stderr=stderr))
        assert status["StatusCode"] == 0, f"{argv} exited with {status['StatusCode']}:\n" + \
            container.logs(stdout=True, stderr=True).decode(errors="replace")[-3000:]
        return output
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.APIError as exc:
                warnings.warn(f"container {container.short_id} of {image} was not removed: {exc}", stacklevel=2)
        client.close()


def test_the_relay_image_holds_no_compiler_no_pip_cache_and_no_sources(relay_image):
    found = json.loads(_run(relay_image, "-c", _INVENTORY, entrypoint=["python"]))
    assert found == {"compilers": [], "pip_caches": [], "sources": []}, found
    assert "run" in _run(relay_image, "--help").decode()


def test_the_pipeline_image_materializes_a_topic_into_a_view_equal_to_the_outbox(env, pipeline_image, tmp_path):
    written = write_events(env.db, env.settings.outbox_collection, total=120, writers=2)
    with RelayThread(env.settings):
        wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 120, 90, "120 events")
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the image's user (10001) writes the lake there
    logs = _run(pipeline_image, "materialize", "--once", "--output", "/data/lake", "--shuffle-partitions", "2",
                "--spark-conf", "spark.ui.enabled=false", "--view-collection", VIEW_COLLECTION,
                environment=container_env(env.settings) | {"JAVA_TOOL_OPTIONS": JAVA_TOOL_OPTIONS},
                volumes={str(data): {"bind": "/data", "mode": "rw"}}, stderr=True, timeout=900)
    assert (data / "lake" / "events").is_dir(), logs.decode(errors="replace")[-3000:]
    expected = outbox_state(env.outbox, [("order", written)])
    position_of = positions(read_topic(env.servers.kafka_bootstrap, env.topic()))
    assert_view_equals_outbox(mongo_view(env.db, VIEW_COLLECTION), expected, position_of)

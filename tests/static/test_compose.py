"""docker-compose.yml, checked without a Docker engine.

1. The Compose Specification's JSON schema (`compose-spec.json`, Apache-2.0, as vendored by the
   `check-jsonschema` wheel in the `test` extra together with its license) validates the file.
2. The wiring a schema cannot see: the relay's settings pass the relay's own validation, its
   addresses name the services that serve them, the replica set the init container initiates
   is the one the URI names, the broker runs in KRaft mode with the properties of the broker
   the tests run against, health conditions point at services that have health checks, the
   Spark pipeline sits behind its profile and runs `outbox-relay pipeline materialize`.
What only `docker compose up` can show (images pull and start, the stack becomes healthy) is
not run here; see the README, "Containers".
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest

from relay.dev import stack as devstack
from tests.static.support import COMPOSE, DOCKERFILE, load_yaml, relay_settings
from tests.support.paths import ROOT


def _schema() -> dict[str, Any]:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "compose-spec.json").read_text())


def _errors(document: Any) -> list[str]:
    schema = _schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def _depends(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def test_compose_file_is_valid_against_the_compose_specification_schema(compose):
    assert _errors(compose) == []


def test_the_schema_check_would_catch_a_mistyped_key(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["relay"]["depends_onn"] = ["kafka"]
    broken["services"]["kafka"]["healthcheck"]["interval"] = 10  # durations are strings
    assert len(_errors(broken)) >= 2


def test_stack_has_mongodb_kafka_relay_demo_and_the_spark_pipeline_behind_a_profile(services):
    assert {"mongo", "mongo-init", "kafka", "relay", "demo", "pipeline"} <= set(services)
    for name in ("mongo", "mongo-init", "kafka", "relay", "demo"):
        assert "profiles" not in services[name], f"{name} must start with a plain `docker compose up`"
    pipeline = services["pipeline"]
    assert pipeline["profiles"] == ["spark"]
    assert pipeline["entrypoint"][:3] == ["outbox-relay", "pipeline", "materialize"]
    assert "--output" in pipeline["command"]


def test_images_are_pinned_and_build_targets_exist(services):
    stages = re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE.read_text(), re.M)
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).exists()
            assert build["target"] in stages, f"{name}: no stage {build['target']}"
        image = service.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag ({image})"
    assert services["relay"]["build"]["target"] == stages[-1] == "relay"


def test_relay_settings_pass_the_relays_own_validation(services):
    for name in ("relay", "demo", "pipeline"):
        settings = relay_settings(services[name]["environment"])
        assert settings.database == "app" and settings.outbox_collection == "outbox"
    assert "RELAY_INSTANCE_ID" not in services["relay"]["environment"], \
        "a fixed instance id would make scaled replicas share one lease owner"


def test_relay_reaches_the_replica_set_the_init_container_initiates(services):
    uri = urlsplit(relay_settings(services["relay"]["environment"]).mongodb_uri)
    host, port = uri.hostname, uri.port or 27017
    replica_set = dict(p.split("=", 1) for p in uri.query.split("&"))["replicaSet"]
    mongo = services[host]
    assert mongo["command"][mongo["command"].index("--replSet") + 1] == replica_set
    script = services["mongo-init"]["entrypoint"][-1]
    assert f'_id: "{replica_set}"' in script and f'host: "{host}:{port}"' in script
    assert "directConnection=true" in " ".join(services["mongo-init"]["entrypoint"])
    assert services["mongo-init"]["restart"] == "no"
    for name in ("relay", "demo", "pipeline"):
        assert _depends(services[name]).get("mongo-init") == "service_completed_successfully", name


def test_init_script_is_valid_javascript(services, tmp_path: Path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the mongosh script's syntax is not checked")
    script = tmp_path / "init.js"
    script.write_text(services["mongo-init"]["entrypoint"][-1])
    result = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_kafka_runs_in_kraft_mode_like_the_broker_the_tests_use(services):
    kafka = services["kafka"]
    env = {k: str(v) for k, v in kafka["environment"].items()}
    assert kafka["image"].startswith("apache/kafka:")
    assert kafka["image"].split(":")[1] == devstack.KAFKA_VERSION
    assert not any("ZOOKEEPER" in k for k in env)
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16, "CLUSTER_ID must be a base64url UUID"
    tested = dict(line.split("=", 1) for line in devstack._BROKER_PROPERTIES.splitlines() if "=" in line)
    for prop, value in tested.items():
        if "{" in value or prop == "log.dirs":  # addresses and folders differ by design
            continue
        given = env.get("KAFKA_" + prop.upper().replace(".", "_"))
        if prop == "listener.security.protocol.map":  # compose adds a listener for the host
            assert set(value.split(",")) <= set((given or "").split(",")), prop
        else:
            assert given == value, prop
    bootstrap = relay_settings(services["relay"]["environment"]).kafka_bootstrap_servers
    assert f"PLAINTEXT://{bootstrap}" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert bootstrap.split(":")[0] in services


def test_health_conditions_point_at_services_with_health_checks(services):
    for name, service in services.items():
        for target, condition in _depends(service).items():
            assert target in services, f"{name} depends on unknown {target}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target}'s health check"


def test_relay_http_port_is_published_and_bind_mounts_exist(services):
    port = relay_settings(services["relay"]["environment"]).http_port
    assert any(str(p).endswith(f":{port}") for p in services["relay"]["ports"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
    demo = services["demo"]
    script = next(v.split(":")[1] for v in demo["volumes"] if v.startswith("./deploy/"))
    assert demo["entrypoint"][-1] == script

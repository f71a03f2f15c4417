"""The sidecar manifest in deploy/kubernetes, checked without a cluster.

kubernetes-validate (in the `test` extra) validates every document against the Kubernetes API
schemas in strict mode (unknown fields are errors); then the relay container's contract: probes
on /livez and /readyz on the relay's HTTP port, resources, a unique instance id, settings that
pass the relay's own validation, the image's non-root user. `kubectl apply` against a real
cluster is not run here.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.static.support import KUBERNETES, relay_settings

# The oldest Kubernetes minor still commonly run; the manifest uses nothing newer.
KUBERNETES_VERSION = "1.29.0"


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(KUBERNETES.read_text()) if d]


def _by_kind(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == kind)


def _relay(documents: list[dict[str, Any]]) -> dict[str, Any]:
    pod = _by_kind(documents, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "outbox-relay")


def test_every_document_is_valid_for_the_kubernetes_api(documents):
    assert {d["kind"] for d in documents} == {"ConfigMap", "Secret", "Deployment"}
    for doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_would_catch_a_mistyped_field(documents):
    broken = copy.deepcopy(_by_kind(documents, "Deployment"))
    relay = next(c for c in broken["spec"]["template"]["spec"]["containers"] if c["name"] == "outbox-relay")
    relay["livenesProbe"] = relay.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_service_and_relay_share_the_pod(documents):
    pod = _by_kind(documents, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["orders", "outbox-relay"]
    assert pod["terminationGracePeriodSeconds"] >= 30, "time to finish the batch and release the lease"


def test_relay_probes_use_livez_and_readyz_on_the_relay_port(documents):
    relay = _relay(documents)
    config = _by_kind(documents, "ConfigMap")["data"]
    port = relay_settings(config).http_port
    named = {p["name"]: p["containerPort"] for p in relay["ports"]}
    for probe, path in (("livenessProbe", "/livez"), ("startupProbe", "/livez"), ("readinessProbe", "/readyz")):
        get = relay[probe]["httpGet"]
        assert get["path"] == path, probe
        assert named.get(get["port"], get["port"]) == port, probe
    pod = _by_kind(documents, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_relay_has_resources_a_unique_instance_id_and_valid_settings(documents):
    relay = _relay(documents)
    assert {"cpu", "memory"} <= set(relay["resources"]["requests"])
    assert "memory" in relay["resources"]["limits"]
    env = {e["name"]: e for e in relay["env"]}
    assert env["RELAY_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["RELAY_MONGODB_URI"]["valueFrom"]["secretKeyRef"]["name"] == "orders-mongodb"
    secret = _by_kind(documents, "Secret")["stringData"]["uri"]
    config = _by_kind(documents, "ConfigMap")["data"]
    settings = relay_settings({**config, "RELAY_MONGODB_URI": secret, "RELAY_INSTANCE_ID": "orders-abc"})
    assert settings.log_format == "json"
    assert "replicaSet=" in settings.mongodb_uri


def test_relay_runs_as_the_images_non_root_user_on_a_read_only_root(documents):
    relay = _relay(documents)
    security = relay["securityContext"]
    assert security["runAsUser"] == 10001 and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
    from tests.static.test_dockerfile import _stages

    assert _stages()[1][-1].last("USER") == "10001:10001"

"""The relay image as a sidecar container (testcontainers, host network) against the test servers.

One image build per run (the `relay_image` session fixture); each test starts its own containers
on its own database and topics (the `env` fixture) and removes them.
"""

from __future__ import annotations

import json

import pytest

from tests.containers.images import healthcheck
from tests.containers.sidecar import Sidecar
from tests.support import assert_complete_and_ordered, lease_doc, read_topic, topic_size, wait_until, write_events

# The first test to need an image builds it (cold: several minutes on a busy machine).
pytestmark = [pytest.mark.usefixtures("docker_api"), pytest.mark.timeout(1800)]


@pytest.fixture
def sidecars(relay_image):
    started: list[Sidecar] = []

    def start(settings, role="leader"):
        sidecar = Sidecar(relay_image, settings)
        started.append(sidecar)
        return sidecar.start(role)

    yield start
    for sidecar in started:
        sidecar.remove()


def _published(env, written, timeout=90):
    wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= len(written.ids), timeout,
               f"{len(written.ids)} events on the topic")
    return read_topic(env.servers.kafka_bootstrap, env.topic())


def test_the_sidecar_delivers_as_uid_10001_on_a_read_only_root_with_json_logs(env, sidecars):
    relay = sidecars(env.settings)
    written = write_events(env.db, env.settings.outbox_collection, total=200, writers=2)
    assert_complete_and_ordered(_published(env, written), written)
    assert relay.docker.exec_run(["id", "-u"]).output.decode().strip() == "10001"
    assert relay.docker.attrs["HostConfig"]["ReadonlyRootfs"] is True
    assert relay.docker.exec_run(["touch", "/opt/venv/x"]).exit_code != 0, "the root file system is writable"
    status, metrics = relay.get("/metrics")
    assert status == 200 and b"relay_events_published_total" in metrics
    status, ready = relay.health("/readyz")
    assert status == 200 and ready["role"] == "leader", ready
    lines = [json.loads(line) for line in relay.logs()]  # every line is a JSON object
    assert lines and all({"level", "message"} <= line.keys() for line in lines), lines[:3]


def test_the_image_healthcheck_passes_while_working_and_fails_when_the_relay_is_frozen(
        env, sidecars, engine, relay_image):
    relay = sidecars(env.settings)
    test = healthcheck(engine, relay_image)
    assert relay.healthcheck(test) == 0
    # A stuck loop alone fails /livez only after live_stall_s (at least 60 s; the in-process test
    # tests/integration/test_observe.py shortens it): here the whole relay is frozen.
    relay.signal("SIGSTOP")  # PID 1 is outbox-relay: its loop and its HTTP thread stop
    try:
        assert relay.healthcheck(test) != 0
    finally:
        relay.signal("SIGCONT")
    wait_until(lambda: relay.healthcheck(test) == 0, 30, "the health check to pass again")


def test_sigterm_stores_the_final_checkpoint_and_exits_zero_within_the_grace_period(env, sidecars):
    relay = sidecars(env.settings)
    written = write_events(env.db, env.settings.outbox_collection, total=100, writers=2)
    _published(env, written)
    assert relay.stop(grace=30) == 0  # SIGKILL after 30 s would give 137
    doc = lease_doc(env.db, env.settings)
    assert doc is not None and doc.get("releasedAt") is not None, "the lease is released"
    # The final checkpoint covers every event: a new sidecar publishes only what came after.
    sidecars(env.settings)
    write_events(env.db, env.settings.outbox_collection, total=20, writers=1, seed=3, written=written)
    verdict = assert_complete_and_ordered(_published(env, written), written)
    assert verdict.duplicates == [], f"{len(verdict.duplicates)} events published again after SIGTERM"


def test_a_sigkilled_container_restarted_resumes_and_loses_nothing(env, sidecars):
    first = sidecars(env.settings)
    written = write_events(env.db, env.settings.outbox_collection, total=150, writers=2)
    wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 50, 90, "part of the events")
    first.signal("SIGKILL")
    first.docker.wait(timeout=30)
    write_events(env.db, env.settings.outbox_collection, total=150, writers=2, seed=2, written=written)
    sidecars(env.settings)  # same settings, same instance id: a restarted sidecar
    verdict = assert_complete_and_ordered(_published(env, written), written)
    print(f"\nresumed after SIGKILL: {len(written.ids)} events, {len(verdict.duplicates)} duplicates")


def test_two_containers_on_one_outbox_give_a_leader_and_a_standby(env, sidecars):
    leader = sidecars(env.settings.replace(instance_id="sidecar-a"))
    standby = sidecars(env.settings.replace(instance_id="sidecar-b"), role="standby")
    written = write_events(env.db, env.settings.outbox_collection, total=50, writers=1)
    assert_complete_and_ordered(_published(env, written), written)
    assert leader.health("/readyz")[1]["role"] == "leader"
    assert standby.health("/readyz")[1]["role"] == "standby"

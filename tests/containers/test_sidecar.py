"""The relay image as a sidecar container (testcontainers, host network) against the test servers.

One image build per run (the `relay_image` session fixture); each test starts its own containers
on its own database and topics (the `env` fixture) and removes them.
"""

from __future__ import annotations

import json

import pytest

from tests.containers.images import healthcheck
from tests.containers.sidecar import Sidecar
from tests.support.leases import lease_doc
from tests.support.oracle import assert_complete_and_ordered
from tests.support.topics import read_topic, topic_size
from tests.support.waiting import wait_until
from tests.support.writes import write_events

# `make containers` builds the images; run alone after an edit, the first test to need one
# builds it (cold: several minutes on a busy machine).
pytestmark = [pytest.mark.usefixtures("docker_api"), pytest.mark.timeout(1800)]

_BACKLOG = 4000


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


def test_the_sidecar_delivers_as_uid_10001_on_a_read_only_root_with_json_logs(env, sidecars, engine):
    relay = sidecars(env.settings)
    written = write_events(env.db, env.settings.outbox_collection, total=200, writers=2)
    assert_complete_and_ordered(_published(env, written), written)
    assert relay.docker.exec_run(["id", "-u"]).output.decode().strip() == "10001"
    # The container as the engine runs it (inspected now, not the options the test asked for),
    # and the proof: even root, who may write anywhere on a writable root, gets EROFS there.
    # (/tmp, /var/tmp and /run are no proof: podman mounts tmpfs there under --read-only.)
    assert engine.inspect(relay.docker.id, "container")["HostConfig"]["ReadonlyRootfs"] is True
    for path in ("/x", "/opt/venv/x", "/etc/x"):
        done = relay.docker.exec_run(["touch", path], user="0")
        assert done.exit_code != 0 and b"Read-only file system" in done.output, (path, done.output)
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


def test_sigterm_mid_backlog_stores_a_checkpoint_covering_every_published_event_and_exits_zero(env, sidecars):
    """SIGTERM (the image's STOPSIGNAL) while a backlog is being published: the relay finishes the
    batch in flight, stores its checkpoint and releases the lease, exit 0 within the grace period.
    The heartbeat is long, so no idle store can hide a missing final one (DESIGN.md guarantees 1, 3:
    the stored token covers exactly what Kafka acknowledged; a restart replays at most what came
    after it, and here that is nothing that was published)."""
    settings = env.settings.replace(batch_max_events=20, heartbeat_interval_s=120.0, lease_ttl_s=240.0)
    written = write_events(env.db, settings.outbox_collection, total=_BACKLOG, writers=2)
    relay = sidecars(settings)
    wait_until(lambda: topic_size(env.servers.kafka_bootstrap, env.topic()) >= 100, 90, "the backlog under way")
    assert relay.stop(grace=30) == 0  # SIGKILL after 30 s would give 137
    published = read_topic(env.servers.kafka_bootstrap, env.topic())
    assert len({r.id for r in published}) < _BACKLOG, "the backlog was done before SIGTERM: nothing was in flight"
    doc = lease_doc(env.db, settings)
    assert doc is not None and doc.get("releasedAt") is not None, "the lease is released"
    checkpoint = str(doc["resumeToken"]["_data"])
    last = max(r.position for r in published)
    assert checkpoint >= last, f"the stored checkpoint {checkpoint} is behind the last published event {last}"
    # Restarted with the same settings: the rest of the backlog, and no event published again.
    sidecars(settings)
    verdict = assert_complete_and_ordered(_published(env, written), written)
    replayed = [r.id for r in verdict.duplicates if r.position <= checkpoint]
    assert replayed == [], f"{len(replayed)} events the checkpoint covered were published again"
    assert verdict.duplicates == [], f"{len(verdict.duplicates)} events published again after SIGTERM"
    print(f"\nSIGTERM after {len(published)} of {_BACKLOG} events; restart published the other "
          f"{len(verdict.first) - len({r.id for r in published})}, no duplicates")


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

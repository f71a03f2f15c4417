"""Many outboxes, one change stream per process and database (RELAY_OUTBOXES; docs/outboxes.md),
on real servers: every outbox's events delivered in order, each routed to its own topic; an
outbox added while the relay is down publishes what it holds once; a removed one stops; a poison
event stops or dead-letters naming its outbox; a relay of one outbox upgraded to RELAY_OUTBOXES
keeps its lease and checkpoint.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from relay.config import Settings
from relay.core.errors import PoisonEventError
from relay.outbox import Outbox, OutboxEvent
from tests.support.mongodb import change_streams
from tests.support.oracle import assert_complete_and_ordered
from tests.support.relays import RelayThread
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import Written, write_events


@dataclass
class Outboxes:
    """Three outboxes in two databases: `first.a`, `first.b`, `second.c`."""

    env: object
    names: list[str]

    @property
    def settings(self) -> Settings:
        env = self.env
        prefix = env.settings.topic_template.split(".", 1)[0]  # type: ignore[attr-defined]
        return env.settings.replace(  # type: ignore[attr-defined]
            outboxes=",".join(self.names), topic_template=prefix + ".{database}.{collection}.{aggregateType}"
        )

    def topic(self, namespace: str, aggregate_type: str = "order") -> str:
        return self.settings.topic_template.format(
            database=namespace.split(".", maxsplit=1)[0], collection=namespace.split(".")[1], aggregateType=aggregate_type
        )

    def collection(self, namespace: str):
        db, coll = namespace.split(".")
        return self.env.client[db][coll]  # type: ignore[attr-defined]

    def records(self, namespace: str):
        return read_topic(self.env.servers.kafka_bootstrap, self.topic(namespace))  # type: ignore[attr-defined]

    def wait_published(self, namespace: str, written: Written, timeout: float = 120):
        def done():
            records = self.records(namespace)
            return records if {r.id for r in records} >= written.ids else None

        return wait_until(done, timeout, f"every event of {namespace}", interval=1)


@pytest.fixture
def outboxes(env) -> Iterator[Outboxes]:
    first, second = env.settings.database, f"{env.settings.database}_2"
    names = [f"{first}.a", f"{first}.b", f"{second}.c"]
    for name in names:
        db, coll = name.split(".")
        env.client[db].create_collection(coll)
    try:
        yield Outboxes(env, names)
    finally:
        env.client.drop_database(second)


def _write_all(box: Outboxes, total: int, names: list[str] | None = None) -> dict[str, Written]:
    """`total` events into each outbox, the outboxes written at the same time."""
    written = {n: Written() for n in names or box.names}

    def one(name: str) -> None:
        db, coll = name.split(".")
        write_events(box.env.client[db], coll, total, writers=2, written=written[name], seed=hash(name) % 100)

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in written]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return written


def test_three_outboxes_in_two_databases_each_publish_every_event_in_order_to_their_own_topics(outboxes, env):
    with RelayThread(outboxes.settings) as relay:
        written = _write_all(outboxes, 300)
        for name, w in written.items():
            verdict = assert_complete_and_ordered(outboxes.wait_published(name, w), w)
            assert not verdict.duplicates
        assert relay.metric("relay_events_published_total", outbox=outboxes.names[2]) == 300
        assert relay.metric("relay_lease_held", outbox=outboxes.names[0]) == 1
        streams = change_streams(env.client, {n.split(".")[0] for n in outboxes.names})
        assert len(streams) == 2, f"one change stream per database: {streams}"
    docs = {d["_id"] for d in env.db[env.settings.lease_collection].find()}
    assert set(outboxes.names) <= docs, "each outbox has its lease, under its namespace, in RELAY_DATABASE"


def test_partitions_split_every_outbox_and_one_stream_per_database_serves_them(outboxes, env):
    settings = outboxes.settings.replace(partitions=2)
    with RelayThread(settings) as relay:
        written = _write_all(outboxes, 200)
        for name, w in written.items():
            assert_complete_and_ordered(outboxes.wait_published(name, w), w)
        assert relay.metric("relay_partitions_led") == 6
    docs = {d["_id"] for d in env.db[env.settings.lease_collection].find()}
    assert {f"{n}#{k}/2" for n in outboxes.names for k in range(2)} <= docs


def test_an_outbox_added_while_the_relay_is_down_publishes_what_it_holds_once(outboxes, env):
    a, b, c = outboxes.names
    early = _write_all(outboxes, 40, [c])[c]  # written to c long before it is listed
    first = outboxes.settings.replace(outboxes=f"{a},{b}")
    with RelayThread(first):
        before = _write_all(outboxes, 100, [a, b])
        for name, w in before.items():
            outboxes.wait_published(name, w)
    while_down = _write_all(outboxes, 60, [a, c])  # after the stored checkpoint of a and b
    with RelayThread(outboxes.settings):  # c added
        everything_c = Written()
        everything_c.add_from(early)
        everything_c.add_from(while_down[c])
        verdict = assert_complete_and_ordered(outboxes.wait_published(c, everything_c), everything_c)
        assert not verdict.duplicates, "the added outbox's documents are published once"
        after_a = Written()
        after_a.add_from(before[a])
        after_a.add_from(while_down[a])
        verdict_a = assert_complete_and_ordered(outboxes.wait_published(a, after_a), after_a)
        assert not verdict_a.duplicates, "a is not published again"
    assert env.db[env.settings.lease_collection].find_one({"_id": c}).get("rescan") is None, \
        "the rescan mark goes with the first checkpoint"


def test_a_removed_outbox_stops_being_published_and_the_others_go_on(outboxes, env):
    a, b, c = outboxes.names
    with RelayThread(outboxes.settings):
        first = _write_all(outboxes, 30)
        for name, w in first.items():
            outboxes.wait_published(name, w)
    with RelayThread(outboxes.settings.replace(outboxes=f"{a},{c}")):
        later = _write_all(outboxes, 30)
        outboxes.wait_published(a, later[a])
        outboxes.wait_published(c, later[c])
    ids_b = {r.id for r in outboxes.records(b)}
    assert ids_b == first[b].ids, "nothing written to b after it was removed was published"


def test_a_relay_of_one_outbox_upgraded_to_a_list_keeps_its_lease_and_checkpoint(outboxes, env):
    a, b, _ = outboxes.names
    single = outboxes.settings.replace(outboxes="", outbox_collection="a")
    with RelayThread(single):
        first = _write_all(outboxes, 50, [a])[a]
        outboxes.wait_published(a, first)
    stored = env.db[env.settings.lease_collection].find_one({"_id": a})
    assert stored and stored["resumeToken"]
    with RelayThread(outboxes.settings.replace(outboxes=f"{a},{b}")):
        more = _write_all(outboxes, 20, [a])[a]
        both = Written()
        both.add_from(first)
        both.add_from(more)
        verdict = assert_complete_and_ordered(outboxes.wait_published(a, both), both)
        assert not verdict.duplicates, "resumed from the stored checkpoint"
    after = env.db[env.settings.lease_collection].find_one({"_id": a})
    assert after["fencingToken"] > stored["fencingToken"] and after["resumeToken"]["_data"] > stored["resumeToken"]["_data"]


@pytest.mark.parametrize("policy", ["stop", "dead-letter"])
def test_a_poison_event_in_one_outbox_names_that_outbox(outboxes, env, logs, policy):
    a, b, _ = outboxes.names
    settings = outboxes.settings.replace(on_poison=policy, dead_letter_topic=outboxes.topic(a, "dead"))
    capture = logs("json")
    Outbox(outboxes.collection(b)).add(OutboxEvent.new("order", "k1", "Created", {"n": 1}))
    bad = outboxes.collection(b).insert_one({"aggregateType": "order", "aggregateId": "k2"}).inserted_id  # no eventType
    good = Outbox(outboxes.collection(a)).add(OutboxEvent.new("order", "k3", "Created", {"n": 3}))
    relay = RelayThread(settings)
    with contextlib.ExitStack() as stack:
        relay.start()
        stack.callback(relay.stop)
        if policy == "stop":
            # `stop` stops the process (docs/outboxes.md): a's loop may stop before it takes a's
            # event, which then waits in the outbox for the next run; what is asserted is the stop.
            wait_until(lambda: not relay.thread.is_alive(), 60, "the relay to stop on the poison event")
            assert isinstance(relay.error, PoisonEventError) and str(bad) in str(relay.error)
            stop = [line for line in capture.errors() if line["message"].startswith("stopping on")]
            assert stop and stop[0]["outbox"] == b and stop[0]["event_id"] == str(bad)
        else:
            wait_until(lambda: str(good) in {r.id for r in outboxes.records(a)}, 60, "a's event")
            wait_until(lambda: relay.metric("relay_dead_letters_total", outbox=b) == 1, 60, "the dead letter")
            assert relay.metric("relay_dead_letters_total", outbox=a) == 0
            dead = [line for line in capture.errors() if "dead-lettering" in line["message"]]
            assert dead and b in dead[0]["message"]


def test_prune_cleans_up_each_outbox_by_its_own_position(outboxes, env):
    """`outbox prune` (every outbox, or `--outbox`): each collection's documents its own lease's
    stored checkpoint covers go, the others stay."""
    from relay.commands.outbox import prune_outbox

    a, b, c = outboxes.names
    with RelayThread(outboxes.settings):
        written = _write_all(outboxes, 20)
        for name, w in written.items():
            outboxes.wait_published(name, w)
    later = _write_all(outboxes, 5, [b])[b]  # not published: the relay is down
    lines = prune_outbox(outboxes.settings, outbox=a)
    assert outboxes.collection(a).count_documents({}) == 0 and lines[-1].endswith(f"20 documents in {a}")
    assert outboxes.collection(b).count_documents({}) == 25, "--outbox: only a"
    prune_outbox(outboxes.settings)
    assert outboxes.collection(c).count_documents({}) == 0
    left = {str(d["_id"]) for d in outboxes.collection(b).find({}, {"_id": 1})}
    assert left == later.ids, "b keeps what its checkpoint does not cover"

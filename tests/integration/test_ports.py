"""Servers on a busy machine (issue 50, fault 19): a port taken by another process between the
reservation's check and the server's bind, the usual race on a machine where other jobs run.
The start succeeds on another port (mongod, the Kafka broker's controller); a restart, which
keeps its ports, fails with one line naming the port and the log.

The race is made certain, not waited for: another process listens on the port, and the
reservation's bind check (relay.dev.ports.bindable) is told once that the port is free, as it was
a moment before that process bound it. Everything else is real: the servers, their failed binds,
their logs."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest

from relay.dev import ports
from relay.dev.errors import PortTakenError
from relay.dev.processes import spawn
from relay.dev.stack import QUICK_START_JVM, KafkaBroker, MongoReplicaSet

_LISTEN = ("import socket, sys, time\n"
           "s = socket.socket()\n"
           "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
           "s.listen()\n"
           "print('listening', flush=True)\n"
           "time.sleep(600)\n")


@contextlib.contextmanager
def another_process_listening() -> Iterator[int]:
    """A port another process (not of the project's reservations) listens on."""
    (reservation,) = ports.reserve(1)
    port = reservation.port
    reservation.release()
    holder = spawn([sys.executable, "-c", _LISTEN, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "listening"
        yield port
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.fixture
def taken_after_the_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A port another process listens on, which the reservation's check finds free once."""
    with another_process_listening() as port:
        told: list[int] = []
        check = ports.bindable

        def free_once(p: int) -> bool:
            if p == port and not told:
                told.append(p)
                return True
            return check(p)

        monkeypatch.setattr(ports, "bindable", free_once)
        yield port


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="outbox-relay-ports-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_mongod_whose_port_is_taken_as_it_starts_comes_up_on_another(taken_after_the_check, folder):
    rs = MongoReplicaSet(folder, ports=[taken_after_the_check])
    rs.start()
    try:
        assert rs.ports[0] != taken_after_the_check
        assert "Address already in use" in (folder / "mongod0.log").read_text(), "it did meet the taken port"
        with pymongo.MongoClient(rs.uri, serverSelectionTimeoutMS=30000) as client:
            client.ports_check.things.insert_one({"ok": True})
        first, last = ports.ephemeral_range()
        assert not first <= rs.ports[0] <= last
    finally:
        rs.stop()


def test_a_kafka_broker_whose_controller_port_is_taken_as_it_starts_comes_up_on_another(taken_after_the_check, folder):
    """The failure of the busy-machine run: "Socket server failed to bind to 127.0.0.1:P"."""
    from confluent_kafka.admin import AdminClient

    broker = KafkaBroker(folder, jvm_options=QUICK_START_JVM, controller_port=taken_after_the_check)
    broker.start()
    try:
        assert broker.controller_port != taken_after_the_check
        assert f"failed to bind to 127.0.0.1:{taken_after_the_check}" in (folder / "kafka.log").read_text()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        assert admin.list_topics(timeout=30).brokers
        first, last = ports.ephemeral_range()
        assert not first <= broker.port <= last and not first <= broker.controller_port <= last
    finally:
        broker.stop()


def test_a_restarted_replica_set_whose_port_was_taken_fails_with_one_line_naming_it_and_the_log(folder):
    """A set with data keeps its ports (its configuration names them): one line, not a retry."""
    rs = MongoReplicaSet(folder)
    rs.start()
    rs.stop()  # its ports go back to the machine
    (port,) = rs.ports
    holder = spawn([sys.executable, "-c", _LISTEN, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "listening"
        with pytest.raises(PortTakenError) as taken:
            rs.start()
    finally:
        holder.kill()
        holder.wait(timeout=30)
        rs.stop()
    assert str(taken.value) == (f"mongod on port {port} could not start: port {port} is taken by another process "
                                f"(a restart keeps the ports its data and clients know); log {folder / 'mongod0.log'}")
    assert not [p for p in rs.processes if p.alive]

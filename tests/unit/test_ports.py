"""relay.dev.ports and the start rules of relay.dev.processes: ports outside the kernel's
ephemeral range, reserved so that no two processes hold one, held by the server that inherits
the reservation, and a start that meets a taken port retried on fresh ones (boundedly)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relay.dev import ports
from relay.dev.errors import JavaMissingError, PortTakenError
from relay.dev.processes import ManagedProcess, bind_failure, java, spawn, start_on_free_ports
from tests.support.paths import ROOT


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_where_it_is_missing(tmp_path):
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("32768\t60999\n")
    assert ports.ephemeral_range(setting) == (32768, 60999)
    assert ports.ephemeral_range(tmp_path / "missing") == (32768, 65535)
    setting.write_text("nonsense\n")
    assert ports.ephemeral_range(setting) == (32768, 65535)


def test_candidates_lie_outside_the_ephemeral_range_and_above_the_well_known_ports():
    pool = ports.candidates((32768, 60999))
    assert min(pool) == 10000 and max(pool) == 65535
    assert not any(32768 <= p <= 60999 for p in pool)
    assert ports.candidates((10000, 65535)) == list(range(1024, 10000)), "a wide range leaves the low ports"
    with pytest.raises(ports.DevStackError, match="no port outside the ephemeral range 1-65535"):
        ports.candidates((1, 65535))


def test_reserved_ports_are_outside_this_machines_ephemeral_range_and_held_until_released():
    first, last = ports.ephemeral_range()
    got = ports.reserve(40)
    try:
        numbers = [r.port for r in got]
        assert len(set(numbers)) == 40
        assert not [p for p in numbers if first <= p <= last], (first, last)
        assert all(p >= 10000 for p in numbers)
        assert ports.reserve_port(numbers[0]) is None, "held: no second reservation, in this process either"
    finally:
        for reservation in got:
            reservation.release()
    again = ports.reserve_port(numbers[0])
    assert again is not None, "released: free again"
    again.release()
    assert not (ports.LOCK_DIR / f"{numbers[0]}.lock").exists(), "a released lock nobody holds is deleted"


def test_a_port_something_listens_on_is_never_reserved():
    (free,) = ports.reserve(1)
    free.release()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free.port))  # outside the project's reservations, as any other program
        listener.listen()
        busy = free.port
        assert ports.reserve_port(busy) is None
        (got,) = ports.reserve(1, prefer=[busy])
        assert got.port != busy
        got.release()


_RESERVER = textwrap.dedent("""
    import json, sys
    from relay.dev import ports
    prefer = json.loads(sys.argv[1])
    sys.stdin.readline()  # every reserver starts at once
    got = ports.reserve(len(prefer), prefer=prefer)
    print(json.dumps([r.port for r in got]), flush=True)
    sys.stdin.read()  # hold them until the test has read every process's ports
""")


def test_processes_reserving_the_same_ports_at_once_never_share_one():
    """Four processes each ask for the same 25 ports at the same moment: each port goes to one."""
    picked = ports.reserve(25)
    wanted = [r.port for r in picked]
    for reservation in picked:  # let go: numbers the reservers now race for
        reservation.release()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [spawn([sys.executable, "-c", _RESERVER, json.dumps(wanted)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(4)]
    try:
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        got = [json.loads(proc.stdout.readline()) for proc in procs]
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=60)
    every = [p for numbers in got for p in numbers]
    assert all(len(numbers) == 25 for numbers in got), got
    assert len(every) == len(set(every)) == 100, "no port handed to two processes"
    assert set(wanted) <= set(every), "each wanted port went to one of them"
    first, last = ports.ephemeral_range()
    assert not [p for p in every if first <= p <= last]


def test_a_server_that_inherits_the_reservation_holds_the_port_after_its_starter_lets_go(tmp_path):
    """What keeps a detached `dev up` stack's ports reserved after the command has exited."""
    held = ports.Ports()
    (port,) = held.take([0], "sleeper")
    server = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "log",
                            pass_fds=held.fds)
    server.start()
    try:
        held.release()
        assert ports.reserve_port(port) is None, "the server holds the lock"
    finally:
        server.kill()
    again = ports.reserve_port(port)
    assert again is not None, "the server gone, so is its lock"
    again.release()


def test_ports_keep_what_they_hold_and_replace_a_refused_port():
    held = ports.Ports()
    try:
        a, b = held.take([0, 0], "a server")
        assert held.take([a, b], "a server") == [a, b], "a restart keeps its ports"
        held.refuse(b)
        a2, c = held.take([a, b], "a server")
        assert a2 == a and c not in (a, b), "the taken port is replaced, the other kept"
        held.release()
        assert held.take([a, c], "a server") == [a, c], "after a stop the same numbers are wanted again"
    finally:
        held.release()


def test_a_restart_whose_port_another_reservation_holds_says_so_in_one_line():
    other = ports.reserve(1)[0]
    try:
        with pytest.raises(PortTakenError) as taken:
            ports.Ports().take([other.port], "mongod", exact=True)
    finally:
        other.release()
    assert str(taken.value) == f"mongod could not start: port {other.port} is taken by another process (reserved there)"


@pytest.mark.parametrize(("line", "port"), [
    ('{"s":"E","c":"CONTROL","msg":"Error setting up listener","attr":{"error":{"errmsg":"Address already in use"}}}',
     20001),
    ("org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:20002: Address already in use.",
     20002),
    ("Port 20001 seems to be in use by another process. Quarkus may already be running", 20001),
    ("Caused by: java.net.BindException: Address already in use", 20001),
    # rabbitmq-server's AMQP listener and its Erlang distribution port; epmd started with -d
    ('{"init terminating in do_boot",{error,{could_not_start_listener,"127.0.0.1",20002,{{shutdown,{failed_to_start_'
     'child,ranch_acceptors_sup,{listen_error,{acceptor,{127,0,0,1},20002},eaddrinuse}}}}}}', 20002),
    ("Application rabbitmq_prelaunch exited with reason: {{shutdown,{failed_to_start_child,prelaunch,"
     '{dist_port_already_used,20002,not_erlang,"localhost"}}}', 20002),
    ("epmd: Sat Nov 28 07:05:35 2026: there is already a epmd running at port 20002 on ipaddr 127.0.0.1", 20002),
])
def test_a_servers_bind_failure_is_read_from_its_log_with_the_port_it_names(line, port):
    assert bind_failure(f"starting\n{line}\nshutting down\n", [20001, 20002]) == port
    assert bind_failure("starting\nlistening on 20001\n", [20001, 20002]) is None


def test_a_fresh_start_that_meets_a_taken_port_is_tried_again_on_fresh_ports_a_bounded_number_of_times():
    calls: list[int] = []

    def taken_twice() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise PortTakenError("Kafka broker on port 1", 20000 + len(calls), Path("/x/kafka.log"))

    start_on_free_ports(taken_twice, fresh=True)
    assert len(calls) == 3

    calls.clear()

    def always_taken() -> None:
        calls.append(1)
        raise PortTakenError("Kafka broker on port 1", 20000 + len(calls), Path("/x/kafka.log"))

    with pytest.raises(PortTakenError) as failed:
        start_on_free_ports(always_taken, fresh=True)
    assert len(calls) == 3
    assert str(failed.value) == ("Kafka broker on port 1 could not start: port 20003 is taken by another process "
                                 "(the last of 3 starts, each on fresh ports); log /x/kafka.log")

    calls.clear()
    with pytest.raises(PortTakenError, match=r"\(a restart keeps the ports its data and clients know\); log"):
        start_on_free_ports(always_taken, fresh=False)
    assert len(calls) == 1, "a restart keeps its ports: not retried"


def test_java_missing_or_too_old_is_one_line_with_exit_code_2(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaMissingError) as missing:
        java()
    assert str(missing.value) == ("Java 17 or newer is needed to run the Kafka broker: no `java` on PATH "
                                  "(install a JDK, or set JAVA_HOME)")
    assert missing.value.exit_code == 2
    old = tmp_path / "java"
    old.write_text('#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
    old.chmod(0o755)
    with pytest.raises(JavaMissingError, match=f"{old} is Java 11$"):
        java()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(JavaMissingError, match="JAVA_HOME=.*/jdk holds no bin/java"):
        java()


def test_held_ports_last_until_the_process_exits():
    code = "from relay.dev import ports; print(ports.held_port(), flush=True); import time; time.sleep(120)"
    proc = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    try:
        port = int(proc.stdout.readline())
        assert ports.reserve_port(port) is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    again = ports.reserve_port(port)
    assert again is not None, "a crash lets go of the lock too"
    again.release()

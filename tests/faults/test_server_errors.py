"""Server errors by name (docs/faults.md row 16, issue 42): failpoints on a real mongod make the
getMore on the change stream, the aggregate that opens it and the checkpoint's update fail, with a
resumable error and with one the relay does not expect (BadValue, code 2). The relay runs as
`outbox-relay run` in a child process, logging JSON lines as in a container.

Every line names the error as `CodeName (code): message` with what the relay was doing, never the
server's raw reply (`RawBSONDocument(b"\\x...`); an unexpected error stops the relay with one
ERROR line (ServerRefusedError) and exit code 5, without a traceback at the default log level."""

from __future__ import annotations

import json
from typing import Any

import pytest

from relay.core.errors import EXIT_SERVER
from tests.support.leases import lease_doc
from tests.support.mongodb import failpoint
from tests.support.relays import RelayProcess
from tests.support.topics import read_topic
from tests.support.waiting import wait_until
from tests.support.writes import write_events

RAW_REPLY = ("RawBSONDocument", 'b"\\x', "b'\\x", "full error", "Traceback")


def _lines(proc: RelayProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]


def _assert_no_raw_reply(proc: RelayProcess) -> None:
    text = proc.log()
    for raw in RAW_REPLY:
        assert raw not in text, f"{raw!r} in the relay's log:\n{text[-4000:]}"


def _published(env, n: int) -> None:
    wait_until(lambda: len({r.id for r in read_topic(env.servers.kafka_bootstrap, env.topic())}) >= n,
               120, f"{n} distinct events in the topic", interval=1)


def _leading(env, proc: RelayProcess) -> None:
    wait_until(lambda: (d := lease_doc(env.db, env.settings)) and d.get("resumeToken") is not None, 60,
               f"the relay to store a checkpoint:\n{proc.log()[-3000:]}")


def _refused_line(proc: RelayProcess, doing: str) -> dict[str, Any]:
    code = proc.proc.wait(timeout=120) if proc.proc is not None else None
    assert code == EXIT_SERVER, f"exit {code}:\n{proc.log()[-4000:]}"
    errors = [line for line in _lines(proc) if line["level"] == "ERROR"]
    assert len(errors) == 1, errors
    (stop,) = errors
    assert stop["error_kind"] == "ServerRefusedError" and stop["exit_code"] == EXIT_SERVER, stop
    assert f"{doing}: BadValue (2): Failing command via 'failCommand' failpoint" in stop["message"], stop
    assert "exc" not in stop, "no traceback at the default log level"
    _assert_no_raw_reply(proc)
    return stop


# (commands the failpoint fails, what the relay was doing as its line says it; {db} is the test's database)
UNEXPECTED = {
    "getMore": (["getMore"], "getMore on the change stream of {db}.outbox"),
    "aggregate": (["aggregate"], "aggregate opening the change stream of {db}.outbox"),
    "checkpoint-update": (["update"], "update on {db}.outbox_relay_leases"),
}


@pytest.mark.parametrize("case", list(UNEXPECTED))
def test_an_unexpected_server_error_stops_with_one_line_naming_it_and_exit_5(env, tmp_path, case):
    commands, doing = UNEXPECTED[case]
    doing = doing.format(db=env.settings.database)
    write_events(env.db, env.settings.outbox_collection, total=50, writers=1)
    proc = RelayProcess(env.settings, tmp_path, case)
    try:
        if case == "aggregate":  # the aggregate that opens the change stream, at start
            with failpoint(env.client, "alwaysOn", failCommands=commands, errorCode=2,
                           namespace=f"{env.settings.database}.{env.settings.outbox_collection}"):
                proc.start()
                _refused_line(proc, doing)
            return
        proc.start()
        _leading(env, proc)
        _published(env, 50)
        with failpoint(env.client, "alwaysOn", failCommands=commands, errorCode=2):
            write_events(env.db, env.settings.outbox_collection, total=5, writers=1, seed=7)
            _refused_line(proc, doing)
    finally:
        proc.stop()


# (the failpoint's data, the words a line names the error with; {db} is the test's database)
RESUMABLE = {
    "getMore": (dict(failCommands=["getMore"], errorCode=6, errorLabels=["ResumableChangeStreamError"]),
                "getMore on the change stream of {db}.outbox: HostUnreachable (6): "),
    "aggregate": (dict(failCommands=["aggregate", "getMore"], errorCode=6, errorLabels=["ResumableChangeStreamError"]),
                  "aggregate opening the change stream of {db}.outbox: HostUnreachable (6): "),
    "checkpoint-update": (dict(failCommands=["update"], errorCode=91),  # ShutdownInProgress: transient
                          "update on {db}.outbox_relay_leases: ShutdownInProgress (91): "),
}


@pytest.mark.parametrize("case", list(RESUMABLE))
def test_resumable_server_errors_are_logged_by_name_without_the_raw_reply(env, tmp_path, case):
    data, named = RESUMABLE[case]
    named = named.format(db=env.settings.database)
    written = write_events(env.db, env.settings.outbox_collection, total=50, writers=1)
    proc = RelayProcess(env.settings.replace(restart_backoff_max_s=0.5), tmp_path, case).start()
    try:
        _leading(env, proc)
        _published(env, len(written.ids))
        with failpoint(env.client, {"times": 8}, **data):
            more = write_events(env.db, env.settings.outbox_collection, total=50, writers=1, seed=3, written=written)
            wait_until(lambda: any(named in line["message"] for line in _lines(proc)), 60,
                       f"a line naming the error as {named!r}:\n{proc.log()[-3000:]}")
        _published(env, len(more.ids))
        assert proc.alive, proc.log()[-4000:]
        assert not [line for line in _lines(proc) if line["level"] == "ERROR"], proc.log()[-4000:]
        _assert_no_raw_reply(proc)
    finally:
        proc.stop()

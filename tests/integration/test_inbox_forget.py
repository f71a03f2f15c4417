"""`outbox-relay inbox forget` and the README's runbook "a consumer lost its state", against real
servers: the runbook's commands are read from the README and run as written (a shell, the
`outbox-relay` command), with the sync `Inbox` and the `AsyncInbox`; then the consumer's effects
are exactly right again (tests/inbox_support.py: every aggregate's effects are its events'
sequence numbers, once each, in commit order). Bad input: one line and its exit code."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import time

import pytest

from relay.cli import main
from relay.inbox.records import AGGREGATE_INDEX, OCCURRED_INDEX
from relay.outbox import Outbox, OutboxEvent
from tests.inbox_support import (
    EFFECTS,
    FORMS,
    INBOX,
    applied_count,
    assert_effects_exactly_once_in_order,
    consumer,
    effects,
)
from tests.support.oracle import all_published
from tests.support.paths import ROOT
from tests.support.relays import RelayThread, settings_env
from tests.support.waiting import wait_until
from tests.support.writes import Written

GROUP = "shipping"  # the README's runbook names this group


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _runbook() -> tuple[list[str], list[str]]:
    """The README's runbook block: its lines before the line that says to clear the effects (the
    SINCE line), and the commands after it."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Runbook: a consumer lost its state"):]
    block = re.search(r"```sh\n(.*?)\n\s*```", section, re.S).group(1)
    lines = [line.strip() for line in block.splitlines()]
    clear = next(i for i, line in enumerate(lines) if line.startswith("# clear your effects"))
    commands = [line for line in lines[clear + 1:] if line and not line.startswith("#")]
    assert [c.split()[:3] for c in commands] == [["outbox-relay", "inbox", "forget"]] * 2 + [
        ["outbox-relay", "replay", "--since"]], commands
    return lines[:clear], commands


def _shell(env, tmp_path, lines: list[str], since: dt.datetime, narrow: list[str]) -> str:
    """Run `lines` in bash as the README writes them, with `outbox-relay` this checkout's, SINCE
    set to `since`, and `narrow` (the same filter flags) added to each command; their output."""
    setup, commands = lines
    script = [re.sub(r"^SINCE=\S+", f"SINCE={_iso(since)}", line) for line in setup]
    script += [f"{command.split('#')[0].strip()} {' '.join(narrow)}" for command in commands]
    environ = settings_env(env.settings) | {"RELAY_CACHE_DIR": str(tmp_path / "cache")}
    prelude = f'set -e\noutbox-relay() {{ "{sys.executable}" -m relay "$@"; }}\n'
    result = subprocess.run(["bash", "-c", prelude + "\n".join(script)], env=environ, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result.stdout


def _write_and_publish(env, total: int, written: Written, aggregates: int = 12) -> None:
    """`total` more events over `aggregates` aggregates, three to a transaction, each aggregate's
    `seq` going on from what `written` holds (tests/inbox_support.py); then the relay publishes them."""
    outbox, more = Outbox(env.outbox), Written()
    with env.client.start_session() as session:
        for start in range(0, total, 3):
            events = []
            for n in range(start, min(start + 3, total)):
                aggregate = f"o-{n % aggregates:02d}"
                seq = len(written.per_aggregate.get(aggregate, [])) + len(more.per_aggregate.get(aggregate, [])) + 1
                events.append(OutboxEvent.new("order", aggregate, "Changed", {"seq": seq}))
            session.with_transaction(lambda s, events=events: outbox.add_many(events, session=s))
            more.add(events)
    with RelayThread(env.settings):
        all_published(env, more)
    written.add_from(more)


def _settle(env, inbox, count: int) -> None:
    """Wait until the effects hold `count` events (and a second more: nothing else arrives)."""
    wait_until(lambda: applied_count(env.db) >= count, 90, f"{count} events applied", interval=0.3,
               alive=inbox.check_alive)
    time.sleep(1)
    inbox.check_alive()


@pytest.mark.parametrize("form", FORMS)
def test_the_runbook_as_written_makes_a_consumers_effects_exactly_right_again(env, tmp_path, form):
    """The consumer applied two phases of events; its effects are restored from a backup taken
    between them (their inbox records are not): the runbook (clear, forget, replay since the
    backup) brings back exactly the second phase. Then three aggregates' effects are wiped: the
    runbook narrowed to them (`--aggregate`) brings back exactly theirs. Without `inbox forget`
    the replayed events are skipped as duplicates and the effects stay lost."""
    runbook = _runbook()
    written = Written()
    run = dict(topics=[env.topic()], group_id=GROUP, bootstrap_servers=env.servers.kafka_bootstrap)
    first = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with consumer(form, env, **run) as inbox:
        _write_and_publish(env, 150, written)
        _settle(env, inbox, 150)
        backup = list(env.db[EFFECTS].find())
        since = dt.datetime.now(dt.UTC)
        time.sleep(0.01)
        _write_and_publish(env, 150, written)
        _settle(env, inbox, 300)
        assert_effects_exactly_once_in_order(env.db, written)
        records = env.db[INBOX].find_one({"group": GROUP})
        assert {"aggregateType", "aggregateId", "eventType", "occurredAt"} <= set(records), records
        assert {AGGREGATE_INDEX, OCCURRED_INDEX} <= set(env.db[INBOX].index_information())

        # The effects restored from the backup (the records are not): the runbook since then.
        env.db[EFFECTS].delete_many({})
        env.db[EFFECTS].insert_many(backup)
        out = _shell(env, tmp_path, runbook, since, [])
        assert "would delete 150 records" in out and "deleted 150 records of group shipping" in out, out
        _settle(env, inbox, 300)
        assert_effects_exactly_once_in_order(env.db, written)

        # Three aggregates' effects wiped: the runbook narrowed to them, from the first event on.
        wiped = sorted(written.per_aggregate)[:3]
        env.db[EFFECTS].delete_many({"_id": {"$in": wiped}})
        lost = sum(len(written.per_aggregate[a]) for a in wiped)
        narrow = [f"--aggregate {a}" for a in wiped]
        out = _shell(env, tmp_path, runbook, first, narrow)
        assert f"deleted {lost} records" in out and f"(3 aggregates: {', '.join(wiped)})" in out, out
        _settle(env, inbox, 300)
        assert_effects_exactly_once_in_order(env.db, written)


def test_without_forgetting_the_records_a_replay_is_skipped_and_the_effects_stay_lost(env, tmp_path):
    """The control for the runbook test: the same replay without `inbox forget` restores nothing."""
    written = Written()
    run = dict(topics=[env.topic()], group_id=GROUP, bootstrap_servers=env.servers.kafka_bootstrap)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with consumer("sync", env, **run) as inbox:
        _write_and_publish(env, 60, written)
        _settle(env, inbox, 60)
        env.db[EFFECTS].delete_many({})
        setup, commands = _runbook()
        _shell(env, tmp_path, (setup, [c for c in commands if " replay " in f" {c} "]), since, [])
        wait_until(lambda: inbox.metric("relay_inbox_duplicates_skipped_total", topic=env.topic()) >= 60, 90,
                   "the replay skipped", alive=inbox.check_alive)
    assert effects(env.db) == {}


@pytest.fixture
def forget(env, monkeypatch, capsys):
    """`outbox-relay inbox forget ARGS` in this process with the test's settings: (exit code,
    stdout lines, stderr lines)."""
    for key, value in settings_env(env.settings).items():
        if key.startswith("RELAY_"):
            monkeypatch.setenv(key, value)

    def run(*args: str) -> tuple[int, list[str], list[str]]:
        capsys.readouterr()
        code = main(["inbox", "forget", *args])
        captured = capsys.readouterr()
        return code, captured.out.splitlines(), captured.err.splitlines()

    return run


def _records(env, group: str, count: int, start: dt.datetime, **fields) -> None:
    """`count` records of `group` as the inbox writes them (one aggregate each), a second apart."""
    env.db[INBOX].insert_many([
        {"group": group, "eventId": f"{group}-{start.timestamp()}-{n}", "processedAt": start, "topic": "t",
         "partition": 0, "offset": n, "aggregateType": "order", "aggregateId": f"o-{n}", "eventType": "Changed",
         "occurredAt": start + dt.timedelta(seconds=n), **fields}
        for n in range(count)])


def test_a_dry_run_prints_what_it_would_delete_and_the_records_no_filter_selects(env, forget):
    start = dt.datetime(2026, 11, 27, 10, tzinfo=dt.UTC)
    _records(env, GROUP, 10, start)
    _records(env, "billing", 3, start)
    env.db[INBOX].insert_one({"group": GROUP, "eventId": "old", "processedAt": start, "topic": "t", "partition": 0,
                              "offset": 99})  # written by 0.2: no event fields
    env.db[INBOX].update_one({"group": GROUP, "aggregateId": "o-5"}, {"$set": {"deadLettered": True}})

    code, out, err = forget("--group", GROUP, "--since", _iso(start + dt.timedelta(seconds=5)), "--until",
                            _iso(start + dt.timedelta(seconds=8)), "--dry-run")
    assert (code, err) == (0, []), err
    assert out[0] == (f"{env.settings.database}.inbox: the records of group shipping, events that occurred from "
                      "2026-11-27T10:00:05.000Z to 2026-11-27T10:00:08.000Z")
    assert out[1] == ("would delete 4 records: order 4 (4 aggregates: o-5, o-6, o-7, o-8); occurred from "
                      "2026-11-27T10:00:05.000Z to 2026-11-27T10:00:08.000Z; 1 dead-lettered (a replay runs "
                      "their handler again)")
    assert out[2] == "dry run: nothing deleted"
    assert out[3].startswith("note: group shipping also has 1 record no filter selects"), out
    assert env.db[INBOX].count_documents({}) == 14

    code, out, _ = forget("--group", GROUP, "--aggregate", "o-1", "--aggregate", "o-2", "--aggregate-type", "order")
    assert code == 0 and out[-2] == f"deleted 2 records of group shipping from {env.settings.database}.inbox", out
    assert env.db[INBOX].count_documents({"group": GROUP}) == 9
    assert env.db[INBOX].count_documents({"group": "billing"}) == 3, "another group's records are kept"

    code, out, _ = forget("--group", GROUP, "--aggregate", "o-404")
    assert code == 0 and out[1] == "deleting 0 records" and out[2].startswith("deleted 0 records"), out

    code, out, _ = forget("--group", GROUP, "--all")
    assert code == 0 and out[0].endswith("every record of group shipping") and "note" not in out[-1], out
    assert env.db[INBOX].count_documents({"group": GROUP}) == 0
    assert env.db[INBOX].count_documents({}) == 3


@pytest.mark.parametrize(("args", "line"), [
    ([], "outbox-relay: ConfigError: --all: no filter given: pass --since/--until, --aggregate or --aggregate-type "
         "to pick the records of group 'shipping' to forget, or --all to forget every one of them"),
    (["--all", "--aggregate", "o-1"], "outbox-relay: ConfigError: --all: forgets every record of the group: give it "
     "without --since, --until, --aggregate or --aggregate-type, or drop it to forget the selection"),
    (["--since", "2026-11-28T00:00:00Z", "--until", "2026-11-27T00:00:00Z"],
     "outbox-relay: ConfigError: --until: 2026-11-27T00:00:00.000Z lies before --since 2026-11-28T00:00:00.000Z"),
    (["--since", "yesterday"], "outbox-relay: ConfigError: --since: must be an ISO 8601 time "
                               "(e.g. 2026-11-27T10:00:00Z); got 'yesterday'"),
], ids=["no-filter", "all-and-a-filter", "reversed-range", "not-a-time"])
def test_bad_input_is_one_line_and_exit_2(env, forget, args, line):
    _records(env, GROUP, 2, dt.datetime(2026, 11, 27, tzinfo=dt.UTC))
    code, out, err = forget("--group", GROUP, *args)
    assert (code, out, err) == (2, [], [line])
    assert env.db[INBOX].count_documents({}) == 2, "nothing deleted"


def test_a_group_with_no_records_is_one_line_naming_the_groups_there_and_exit_2(env):
    _records(env, "billing", 1, dt.datetime(2026, 11, 27, tzinfo=dt.UTC))
    _records(env, GROUP, 1, dt.datetime(2026, 11, 27, tzinfo=dt.UTC))
    result = subprocess.run([sys.executable, "-m", "relay", "inbox", "forget", "--group", "shiping", "--all"],
                            env=settings_env(env.settings), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.splitlines() == [
        f"outbox-relay: ConfigError: --group: {env.settings.database}.inbox holds no records of group 'shiping' "
        "(groups there: billing, shipping)"]
    assert env.db[INBOX].count_documents({}) == 2

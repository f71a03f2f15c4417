"""`outbox-relay replay`'s rules without servers: where each part of a range is read from, the gap
it refuses, the arguments it refuses, the saved progress, the progress bar and the summary."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import pytest
from bson import ObjectId

from relay.commands.replay import Request, check_arguments, resume_hint, resumed_request
from relay.commands.replay_plan import Part, Removals, Source, add_arguments, check_range, gap, plan
from relay.commands.replay_progress import Counts, bar_line
from relay.commands.replay_state import ReplayState, load_state
from relay.config import Settings
from relay.core.change import Change
from relay.core.config import POISON_POLICIES, SKIP, parse_time, start_at_time
from relay.core.errors import ConfigError, PoisonEventError
from relay.core.message import OutgoingMessage
from relay.core.namespace import Namespace
from relay.core.poison import PoisonPolicy, encode

T0 = dt.datetime(2026, 11, 27, 10, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
APP = Namespace("app", "outbox")


def test_a_range_inside_the_oplog_is_read_from_the_oplog_only():
    assert plan(T0, T0 + H, oplog_start=T0 - H) == [Part(Source.OPLOG, T0, T0 + H)]
    assert plan(T0, T0 + H, oplog_start=T0) == [Part(Source.OPLOG, T0, T0 + H)]


def test_a_range_starting_before_the_oplog_reads_the_collection_up_to_its_start_then_the_oplog():
    assert plan(T0 - H, T0 + H, oplog_start=T0) == [
        Part(Source.COLLECTION, T0 - H, T0),
        Part(Source.OPLOG, T0, T0 + H, occurred_from=T0),
    ]


def test_a_range_ending_before_the_oplog_is_read_from_the_collection_only_until_included():
    [part] = plan(T0 - 2 * H, T0 - H, oplog_start=T0)
    assert part.source is Source.COLLECTION and part.start == T0 - 2 * H
    assert part.end == T0 - H + dt.timedelta(milliseconds=1)  # the end is excluded: `until` itself is in


def test_a_gap_is_reported_only_when_the_collection_part_starts_before_the_oldest_document():
    parts = plan(T0 - H, T0 + H, oplog_start=T0)
    assert gap(APP, parts, T0 - H, T0) is None
    assert gap(APP, parts, T0 - 2 * H, T0) is None
    gone = gap(APP, parts, T0 - H / 2, T0)
    assert gone is not None and "app.outbox" in gone
    assert "from 2026-11-27T09:00:00.000Z to 2026-11-27T09:30:00.000Z" in gone and "--allow-gap" in gone
    assert "or there were none" in gone  # it cannot tell "removed" from "none"
    empty = gap(APP, parts, None, T0)
    assert empty is not None and "to 2026-11-27T10:00:00.000Z" in empty and "empty" in empty
    assert gap(APP, plan(T0, T0 + H, oplog_start=T0 - H), None, T0 - H) is None
    before = gap(APP, plan(T0 - 3 * H, T0 - 2 * H, oplog_start=T0), None, T0)
    assert before is not None and "the oplog starts at 2026-11-27T10:00:00.000Z" in before


def test_no_gap_when_nothing_can_have_removed_the_events_else_the_possible_causes_or_none():
    parts = plan(T0 - 2 * H, T0 + H, oplog_start=T0)
    oldest = T0 - H / 2
    # The oplog holds every write since the replica set began, and no delete of the outbox.
    assert gap(APP, parts, oldest, T0, Removals(complete_oplog=True)) is None
    # No TTL index, clean-up never deleted anything (or only what occurred before --since).
    assert gap(APP, parts, oldest, T0, Removals(cleanup_known=True)) is None
    assert gap(APP, parts, oldest, T0, Removals(cleanup_known=True, cleaned_before=T0 - 3 * H)) is None
    # Clean-up deleted below T0 - H: only what occurred before it may be gone.
    cut = gap(APP, parts, oldest, T0, Removals(cleanup_known=True, cleaned_before=T0 - H))
    assert cut is not None and "to 2026-11-27T09:00:00.000Z may be gone" in cut
    assert "clean-up removed documents that occurred before 2026-11-27T09:00:00.000Z, or there were none" in cut
    assert "replay from 2026-11-27T09:00:00.000Z" in cut
    ttl = gap(APP, parts, oldest, T0, Removals(ttl=("occurredAt", 3600), cleanup_known=True))
    assert ttl is not None and "a TTL index on occurredAt (3600 s) removes documents, or there were none" in ttl
    unknown = gap(APP, parts, oldest, T0, Removals())
    assert unknown is not None and "its lease documents keep no record" in unknown and "or there were none" in unknown


def test_times_are_iso_8601_utc_without_a_zone_one_parser_for_the_replay_and_relay_start_at():
    assert parse_time("--since", "2026-11-27T10:00:00Z") == T0
    assert parse_time("--since", " 2026-11-27t10:00:00z ") == T0
    assert parse_time("--since", "2026-11-27T11:00:00+01:00") == T0
    assert parse_time("--since", "2026-11-27T10:00:00") == T0
    assert start_at_time("2026-11-27T11:00:00+01:00") == T0 and start_at_time("now") is None
    with pytest.raises(ConfigError, match="--since: must be an ISO 8601 time .*; got 'yesterday'"):
        parse_time("--since", "yesterday")
    with pytest.raises(ConfigError, match="RELAY_START_AT: must be oplog-start, now, or an ISO 8601 time"):
        start_at_time("yesterday")


def test_a_range_is_refused_when_reversed_empty_or_in_the_future_and_ends_at_now_at_the_latest():
    now = T0 + H
    assert check_range(T0, T0 + 2 * H, now) == now
    assert check_range(T0, T0 + H / 2, now) == T0 + H / 2
    with pytest.raises(ConfigError, match="--until: .* lies before --since"):
        check_range(T0, T0 - H, now)
    with pytest.raises(ConfigError, match="--until: the range is empty"):
        check_range(T0, T0, now)
    with pytest.raises(ConfigError, match="--since: .* is in the future"):
        check_range(now + H, now + 2 * H, now)


def test_only_configured_outboxes_are_replayed_every_one_by_default_and_a_refusal_names_what_is_set():
    listed = Settings.load(env={"RELAY_OUTBOXES": "app.outbox,billing.outbox"})
    app, billing = Namespace("app", "outbox"), Namespace("billing", "outbox")
    assert listed.pick_outboxes(None) == (app, billing)
    assert listed.pick_outboxes(["billing.outbox", "billing.outbox"]) == (billing,)
    assert listed.pick_outboxes("app.outbox") == (app,)
    with pytest.raises(ConfigError, match=r"--outbox: 'app.other' is not one of the outboxes \(RELAY_OUTBOXES: app.outbox, billing.outbox\)"):
        listed.pick_outboxes(["app.other"])
    single = Settings.load(env={"RELAY_DATABASE": "shop"})
    with pytest.raises(ConfigError, match=r"\(RELAY_DATABASE.RELAY_OUTBOX_COLLECTION: shop.outbox\)") as refused:
        single.pick_outboxes(["app.other"])
    assert "RELAY_OUTBOXES" not in str(refused.value)  # not set: not named


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_arguments_are_checked_before_any_server_is_asked():
    configured = Settings.load(env={"RELAY_DATABASE": "app"})
    outboxes, since, until = check_arguments(_args("--since", "2026-11-27T10:00:00Z"), configured, T0 + H)
    assert (outboxes, since, until) == ((Namespace("app", "outbox"),), T0, T0 + H)
    assert _args("--since", "x", "--rate", "5").rate_limit == 5.0  # --rate is --rate-limit
    for argv, flag in [
        ((), "--since: is required"),
        (("--since", "2026-11-27T10:00:00Z", "--rate-limit", "0"), "--rate-limit"),
        (("--since", "2026-11-27T10:00:00Z", "--to-topic", "a b"), "--to-topic"),
        (("--since", "2026-11-27T10:00:00Z", "--outbox", "x.y"), "--outbox"),
    ]:
        with pytest.raises(ConfigError, match=flag):
            check_arguments(_args(*argv), configured, T0 + H)


def test_saved_progress_round_trips_and_only_a_replay_id_is_resumed(tmp_path):
    state = ReplayState("6f1c1f0e-3b7a-4a51-9a53-8f7f2f8d6c11", {"since": "x"})
    progress = state.outbox(APP)
    key = (T0, ObjectId())
    progress.set_collection_key(key)
    progress.oplog_after = "8266"
    state.save(tmp_path)
    loaded = load_state(tmp_path, state.id)
    assert loaded.request == {"since": "x"}
    assert loaded.outbox(APP).collection_key() == key
    assert loaded.outbox(APP).oplog_after == "8266"
    with pytest.raises(ConfigError, match="--resume: '../etc' is not a replay id"):
        load_state(tmp_path, "../etc")
    with pytest.raises(ConfigError, match="--resume: no saved replay"):
        load_state(tmp_path, "00000000-0000-0000-0000-000000000000")


def test_the_progress_bar_shows_done_of_total_rate_and_time_left():
    assert bar_line(50, 100, 10.0, width=10) == "[#####-----] 50/100 10 events/s, 00:05 left"
    assert bar_line(120, 100, 10.0, width=10) == "[##########] 120/100 10 events/s, --:-- left"
    assert bar_line(0, 0, 0.0, width=4) == "[####] 0/0 0 events/s, --:-- left"


def test_the_summary_counts_per_outbox_topic_and_source():
    counts = Counts()
    counts.add(APP, "t.order", "collection", 2)
    counts.add(APP, "t.order", "oplog", 3)
    counts.add(APP, "t.customer", "oplog")
    assert counts.done == 6
    assert counts.summary() == {
        "app.outbox": {"t.customer": {"oplog": 1, "collection": 0}, "t.order": {"oplog": 3, "collection": 2}}
    }


def test_off_a_terminal_progress_is_a_json_line_every_interval():
    import io
    import json

    from relay.commands.replay_progress import Progress

    now = [0.0]
    counts, out = Counts(), io.StringIO()
    progress = Progress("r1", 100, counts, out=out, tty=False, interval_s=5.0, clock=lambda: now[0])
    counts.add(APP, "t", "oplog", 40)
    now[0] = 4.0
    progress.tick()
    assert out.getvalue() == ""  # not yet: every 5 s
    now[0] = 5.0
    progress.tick()
    assert json.loads(out.getvalue()) == {"replay": "r1", "progress": {"done": 40, "total": 100}, "eventsPerS": 8.0}


class _Encoder:
    """Builds a message for every change but those whose document is b"poison"."""

    def build_many(self, changes, fencing_token):
        return [None] * len(changes)

    def build(self, change, fencing_token):
        if change.document == b"poison":
            raise PoisonEventError(change.event_id, "not encodable")
        return OutgoingMessage(change.event_id, "t", b"k", change.document, [])

    def dead_letter(self, change, reason, fencing_token):
        return OutgoingMessage(change.event_id, "dlq", b"k", reason.encode(), [])


def test_the_replays_skip_policy_leaves_a_poison_event_out_on_the_loops_encode_path():
    changes = [Change(f"e{i}", {"_data": f"0{i}"}, None, -1, b"poison" if i == 1 else b"ok") for i in range(3)]
    set_aside: list[tuple[str, str]] = []
    messages, poison = encode(changes, 0, _Encoder(), PoisonPolicy(SKIP), lambda e, r: set_aside.append((e, r)))
    assert [m.event_id for m in messages] == ["e0", "e2"] and poison is None
    assert set_aside == [("e1", "not encodable")]
    stopped, poison = encode(changes, 0, _Encoder(), PoisonPolicy("stop"), lambda e, r: None)
    assert [m.event_id for m in stopped] == ["e0"] and poison is not None and poison.event_id == "e1"
    assert SKIP not in POISON_POLICIES  # the replay's alone: RELAY_ON_POISON and the inbox refuse it
    with pytest.raises(ConfigError, match="RELAY_ON_POISON"):
        Settings.load(env={"RELAY_ON_POISON": "skip"}).parts()


def test_a_resume_keeps_the_saved_rate_limit_and_a_rate_limit_beside_it_overrides_it_saying_so():
    settings = Settings.load(env={"RELAY_DATABASE": "app"})
    saved = {"outboxes": ["app.outbox"], "since": "2026-11-27T10:00:00.000Z", "until": "2026-11-27T11:00:00.000Z",
             "untilClusterTime": [1, 0], "aggregates": [], "aggregateTypes": [], "toTopic": None, "rateLimit": 100.0}
    request = Request.from_saved(saved, settings)
    assert request.rate_limit == 100.0 and request.saved() == saved  # saved with the replay, read back
    assert resumed_request(request, None) == (request, None)  # kept
    faster, line = resumed_request(request, 250.0)
    assert faster.rate_limit == 250.0 and faster.saved()["rateLimit"] == 250.0  # the next resume keeps this one
    assert line == "--rate-limit 250 given beside --resume overrides the saved rate limit (100 events/s)"
    with pytest.raises(ConfigError, match="--rate-limit: must be greater than 0"):
        resumed_request(request, 0.0)
    older = Request.from_saved({k: v for k, v in saved.items() if k != "rateLimit"}, settings)
    assert older.rate_limit is None  # a state from before rates were saved: no limit, as it ran
    hint = resume_hint("r1", request, None)
    assert hint.startswith("outbox-relay replay --resume r1  # ") and "--rate-limit 100" in hint
    assert "overrides" in hint and "--state-dir d" in resume_hint("r1", older, Path("d"))


def test_replay_help_shows_that_since_or_resume_is_required(capsys):
    from relay.cli import main

    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert usage.startswith("usage: outbox-relay replay (--since TIME | --resume REPLAY_ID) [--until TIME]")
    assert "[--since TIME]" not in usage


def test_a_finished_replay_removes_its_state_file(tmp_path):
    state = ReplayState("6f1c1f0e-3b7a-4a51-9a53-8f7f2f8d6c11", {"since": "x"})
    path = state.save(tmp_path)
    state.remove(tmp_path)
    assert not path.exists()
    with pytest.raises(ConfigError, match="a finished replay leaves none"):
        load_state(tmp_path, state.id)

"""The restart policy's rules (relay.core.restarts), fast: the waits it sleeps, recorded."""

from __future__ import annotations

import pytest

from relay.core.errors import ReopenableStreamError, RepeatedStreamError, TransientError
from relay.core.restarts import FIRST_WAIT_S, JITTER_S, RestartPolicy


def _policy(max_s: float = 30.0) -> tuple[RestartPolicy, list[float], list[tuple[str, float]]]:
    slept: list[float] = []
    reported: list[tuple[str, float]] = []
    policy = RestartPolicy(max_s, slept.append, lambda exc, s: reported.append((str(exc), s)))
    return policy, slept, reported


def test_the_first_restart_is_immediate_and_later_ones_back_off_exponentially_up_to_the_maximum():
    policy, slept, reported = _policy(max_s=1.0)
    for n in range(6):
        policy.restart(TransientError(f"e{n}"))
    assert slept[0] == pytest.approx(FIRST_WAIT_S, abs=JITTER_S) and len(slept) == 5, "no wait before the first"
    assert slept[1] >= 2 * FIRST_WAIT_S and slept[2] >= 4 * FIRST_WAIT_S
    assert max(slept) <= 1.0
    assert [s for _, s in reported] == [0.0, *slept], "each restart is reported with its wait, before it"
    assert [e for e, _ in reported] == [f"e{n}" for n in range(6)]


def test_progress_starts_the_schedule_over():
    policy, slept, _ = _policy()
    policy.restart(TransientError("a"))
    policy.restart(TransientError("b"))
    policy.progressed()
    policy.restart(TransientError("c"))
    assert len(slept) == 1, "the restart after progress is immediate"
    policy.restart(TransientError("d"))
    assert slept[-1] < 2 * FIRST_WAIT_S, "and the next waits the first wait again"


def test_a_poison_replay_starts_at_once_without_moving_the_schedule():
    policy, slept, reported = _policy()
    policy.restart(TransientError("a"))
    policy.restart(TransientError("poison"), at_once=True)
    assert slept == [] and reported[-1] == ("poison", 0.0)
    policy.restart(TransientError("b"))
    assert slept[0] < 2 * FIRST_WAIT_S


def test_the_same_reopenable_code_twice_without_progress_stops():
    policy, _, _ = _policy()
    policy.check_reopen(ReopenableStreamError(280, "ChangeStreamFatalError", "x"))
    policy.check_reopen(ReopenableStreamError(136, "CappedPositionLost", "y"))  # another code: fine
    with pytest.raises(RepeatedStreamError):
        policy.check_reopen(ReopenableStreamError(136, "CappedPositionLost", "y"))
    policy.progressed()
    policy.check_reopen(ReopenableStreamError(136, "CappedPositionLost", "y"))  # after progress: once more

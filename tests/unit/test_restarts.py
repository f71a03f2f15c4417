"""The restart policy's rules (relay.core.restarts), fast: the waits it sleeps, recorded; and the
line a start-up check writes while it waits for a server (relay.core.retry.said_while_waiting)."""

from __future__ import annotations

import pytest

from relay.core.errors import ReopenableStreamError, RepeatedStreamError, TransientError
from relay.core.restarts import FIRST_WAIT_S, JITTER_S, RestartPolicy
from relay.core.retry import FIRST_WAIT_S as FIRST_TRY_S
from relay.core.retry import said_while_waiting


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


# ---- a start-up check that waits for a server (relay.core.retry.said_while_waiting) -----------


class _Server:
    """A call that waits for a server: fails with `errors` in turn, then answers; records each budget."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.budgets = list(errors), []

    def __call__(self, seconds: float) -> str:
        self.budgets.append(seconds)
        if self.errors:
            raise self.errors.pop(0)
        return "answer"


def test_a_server_answering_within_the_first_second_says_nothing():
    server, said = _Server(), []
    assert said_while_waiting(server, 30.0, lambda e: True, said.append) == "answer"
    assert server.budgets == [FIRST_TRY_S] and said == []


def test_a_server_not_answering_yet_is_said_once_then_waited_for_with_the_rest_of_the_budget():
    server, said = _Server(TimeoutError("no answer")), []
    assert said_while_waiting(server, 30.0, lambda e: isinstance(e, TimeoutError), said.append) == "answer"
    assert len(said) == 1 and server.budgets == [FIRST_TRY_S, said[0]]
    assert 30.0 - FIRST_TRY_S - 1 < said[0] <= 30.0, "the whole wait stays within the budget"

    gone = _Server(TimeoutError("no answer"), TimeoutError("still none"))
    with pytest.raises(TimeoutError, match="still none"):
        said_while_waiting(gone, 30.0, lambda e: isinstance(e, TimeoutError), said.append)
    assert len(gone.budgets) == 2, "two attempts at most"


def test_a_refusal_the_server_answers_with_is_raised_at_once_without_the_waiting_line():
    server, said = _Server(PermissionError("bad password")), []
    with pytest.raises(PermissionError):
        said_while_waiting(server, 30.0, lambda e: isinstance(e, TimeoutError), said.append)
    assert said == [] and len(server.budgets) == 1

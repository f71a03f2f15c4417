"""The one stop-signal helper (relay.core.signals) that `run`, the inbox, `replay`, `materialize`
and the demo share: the first SIGTERM or SIGINT asks the stop, a further one does what the caller
chose, and the previous handlers come back after the block."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from relay.core.signals import Then, stopping_on_signals


def _send(signum: int) -> None:
    os.kill(os.getpid(), signum)  # handled in the main thread before the next bytecode runs


def test_the_first_signal_asks_the_stop_a_further_one_asks_again_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    stops: list[int] = []
    with stopping_on_signals(lambda: stops.append(1)):
        _send(signal.SIGTERM)
        _send(signal.SIGINT)
    assert stops == [1, 1]
    assert signal.getsignal(signal.SIGTERM) is before


def test_interrupt_a_further_signal_stops_at_once_with_keyboardinterrupt():
    before = signal.getsignal(signal.SIGINT)  # not always Python's default: Spark installs its own
    stop = threading.Event()
    with stopping_on_signals(stop.set, Then.INTERRUPT, says="stopping"):
        _send(signal.SIGTERM)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            _send(signal.SIGTERM)
    assert signal.getsignal(signal.SIGINT) is before


def test_default_a_further_signal_gets_the_signals_default_action():
    before = signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    with stopping_on_signals(stop.set, Then.DEFAULT):
        _send(signal.SIGTERM)
        assert stop.is_set()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the next one ends the process
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_nothing_is_installed():
    seen = []

    def body() -> None:
        with stopping_on_signals(lambda: None):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGTERM)]

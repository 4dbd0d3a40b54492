"""SIGTERM and SIGHUP end stallbench as Ctrl-C does (``stallbench.cli.stops``); the commands end to end are
tested with each signal in test_cli, test_analyze_command and test_compare_jobs."""

from __future__ import annotations

import os
import signal
import time

import pytest

from stallbench.cli.stops import Stopped, exit_status, stopped_by, stops_as_ctrl_c

STOPPING = (signal.SIGTERM, signal.SIGHUP)


def _handlers() -> dict[int, object]:
    return {signum: signal.getsignal(signum) for signum in STOPPING}


@pytest.mark.parametrize("signum", STOPPING, ids=lambda s: s.name)
def test_each_raises_a_keyboard_interrupt_named_for_it_and_its_handler_comes_back(signum):
    before = _handlers()
    with pytest.raises(Stopped) as stop, stops_as_ctrl_c():
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler runs at once, in this thread
    assert isinstance(stop.value, KeyboardInterrupt)  # every `except KeyboardInterrupt` of Ctrl-C takes it
    assert (exit_status(stop.value), stopped_by(stop.value)) == (128 + signum, f"stopped by {signum.name}")
    assert _handlers() == before


def test_ctrl_c_keeps_its_own_status_and_word():
    assert (exit_status(KeyboardInterrupt()), stopped_by(KeyboardInterrupt())) == (130, "interrupted")


def test_a_hangup_ignored_before_it_started_stays_ignored():
    """``nohup stallbench ...``: a closed terminal must not end it."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stops_as_ctrl_c():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)

"""The shared graceful-stop helper: signals set the event, old handlers come back after."""

from __future__ import annotations

import os
import signal

import pytest

from autoglm.signals import stop_on_signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_sets_the_event_and_the_previous_handler_returns(sig):
    seen = []
    previous = signal.signal(sig, lambda *_: seen.append("old"))
    try:
        with stop_on_signals() as stop:
            assert not stop.is_set()
            os.kill(os.getpid(), sig)
            assert stop.wait(5)
        assert seen == []
        os.kill(os.getpid(), sig)
        assert seen == ["old"]
    finally:
        signal.signal(sig, previous)

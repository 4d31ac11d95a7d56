"""setup_logging: every component's structured lines, without the libraries' routine ones."""

from __future__ import annotations

import json
import logging

import pytest

from autoglm.logs import setup_logging


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_a_scheduler_run_logs_only_when_debug_is_asked_for(capfd, level: str, shown: bool) -> None:
    setup_logging("predictor", level, "json")
    logging.getLogger("apscheduler.executors.default").info('Running job "poll"')
    logging.getLogger("apscheduler.scheduler").warning("Run time of job was missed")
    logging.getLogger("predictor.service").info("refit done")
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()]
    messages = [line["msg"] for line in lines]
    assert ('Running job "poll"' in messages) is shown
    assert "Run time of job was missed" in messages  # a scheduler's warning always shows
    assert "refit done" in messages
    assert {line["component"] for line in lines} == {"predictor"}


def test_text_lines_split_into_their_fields(capfd) -> None:
    setup_logging("batcher", "info", "text")
    logging.getLogger("batcher.server").info(
        "serving", extra={"tls": False, "ready": True, "worker": None, "why": 'a "b"\nc'}
    )
    (line,) = capfd.readouterr().err.splitlines()
    assert " tls=false ready=true worker=null " in line
    assert line.endswith(' why="a \\"b\\"\\nc"')

"""The batcher's private folder: a killed batcher's folder is cleared by the next one to start,
a running batcher's never is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from batcher.private_folder import LOCK_FILE, PREFIX, PrivateFolder, clear_stale

ROOT = Path(__file__).resolve().parents[2]


def test_a_running_batchers_folder_is_kept_and_removed_by_its_owner(tmp_path: Path) -> None:
    first = PrivateFolder(tmp_path)
    (first.path / "http.sock").write_text("")
    second = PrivateFolder(tmp_path)  # clears stale folders as it starts: not the first's
    assert first.path.is_dir() and (first.path / LOCK_FILE).is_file()
    assert clear_stale(tmp_path) == []
    first.remove()
    second.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_killed_batchers_folder_is_cleared_by_the_next_to_start(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from batcher.private_folder import PrivateFolder;"
            "held = PrivateFolder(Path(sys.argv[1])); print(held.path, flush=True);"
            "time.sleep(600)",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        folder = Path(owner.stdout.readline().strip())
        assert folder.is_dir() and clear_stale(tmp_path) == []  # alive: kept
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=30)
        assert folder.is_dir()  # nothing ran to remove it
        started = PrivateFolder(tmp_path)
        assert not folder.exists()
        assert [p.name for p in tmp_path.iterdir()] == [started.path.name]
        started.remove()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


@pytest.mark.parametrize("lock", [None, LOCK_FILE + ".new"], ids=["older version", "being made"])
def test_a_folder_without_its_lock_file_is_left_alone(tmp_path: Path, lock: str | None) -> None:
    folder = tmp_path / (PREFIX + "x")
    folder.mkdir()
    if lock:
        (folder / lock).write_text("")
    assert clear_stale(tmp_path) == []
    assert folder.is_dir()

"""Fixtures for exporter tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.exporter.fake_kubelet import FakeKubelet, KubeletServer
from tests.exporter.processes import ExporterProcess


@pytest.fixture
def start_exporter() -> Iterator[Callable[..., ExporterProcess]]:
    """Start exporter processes; every one still running at teardown is stopped."""
    started: list[ExporterProcess] = []

    def start(*args: str) -> ExporterProcess:
        proc = ExporterProcess(args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A fresh folder under /tmp, removed afterwards: unix socket paths are limited to 108 bytes,
    and pytest's ``tmp_path`` can be longer."""
    folder = Path(tempfile.mkdtemp(prefix="podres-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[KubeletServer]:
    """A fake kubelet serving pod-resources ``List`` on ``socket_dir/kubelet.sock``."""
    server = KubeletServer(socket_dir / "kubelet.sock", FakeKubelet())
    server.start()
    yield server
    server.stop()

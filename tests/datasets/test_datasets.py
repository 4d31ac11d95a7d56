"""The trace catalog, cache folder, name-or-path lookup, fetching over real HTTP, and the CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoglm.datasets import (
    EXCERPTS,
    TRACES,
    DatasetError,
    catalog,
    expected_path,
    resolve,
    traces_dir,
)
from autoglm.datasets.cli import main
from autoglm.datasets.excerpts import DERIVATIONS
from autoglm.datasets.fetch import fetch
from autoglm.datasets.store import sha256_of
from exporter.sources import load_profile

ROOT = Path(__file__).resolve().parents[2]


class Mirror:
    """A real HTTP server over a folder, counting the requests it answers."""

    def __init__(self, root: Path) -> None:
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                mirror.requests += 1
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.requests = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[Mirror, Path]]:
    root = tmp_path / "mirror"
    root.mkdir()
    server = Mirror(root)
    yield server, root
    server.close()


def small_trace(root: Path, content: bytes = b"TIMESTAMP,value\n1,2\n") -> catalog.Trace:
    """A catalog entry for a file put on the mirror, with its true checksum."""
    trace = dataclasses.replace(
        TRACES["azure-llm-code"],
        name="tiny",
        relative_path="tiny-set/tiny.csv",
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
    )
    (root / "tiny-set").mkdir(exist_ok=True)
    (root / "tiny-set/tiny.csv").write_bytes(content)
    return trace


def test_every_catalogued_trace_names_its_origin_licence_and_checksum() -> None:
    for trace in TRACES.values():
        assert trace.url.startswith("https://raw.githubusercontent.com/"), trace.name
        assert trace.url.endswith("/" + trace.relative_path.split("/")[-1])
        assert len(trace.sha256) == 64 and int(trace.sha256, 16) >= 0
        assert trace.licence and trace.citation and trace.size > 0
    for excerpt in EXCERPTS.values():
        assert excerpt.source in TRACES and excerpt.name in DERIVATIONS
        assert excerpt.licence == TRACES[excerpt.source].licence


@pytest.mark.parametrize("name", sorted(EXCERPTS))
def test_committed_excerpts_are_the_catalogued_bytes(name: str) -> None:
    excerpt = EXCERPTS[name]
    assert sha256_of(excerpt.path) == excerpt.sha256, f"{excerpt.path} edited by hand?"


@pytest.mark.parametrize("name", sorted(EXCERPTS))
def test_excerpts_are_derived_from_the_whole_traces(name: str) -> None:
    excerpt = EXCERPTS[name]
    source = expected_path(excerpt.source)
    if not source.is_file():
        pytest.skip(f"needs the whole trace: `autoglm datasets fetch {excerpt.source}`")
    assert DERIVATIONS[name](source) == excerpt.path.read_text(encoding="utf-8")


def test_alibaba_excerpts_hold_aggregates_not_rows() -> None:
    hourly = EXCERPTS["genai-requests-hourly"].path.read_text().splitlines()
    assert hourly[0] == "hour,requests,mean_exec_seconds"
    counts = [int(line.split(",")[1]) for line in hourly[1:]]
    assert sum(counts) == 26823  # every request of the trace counted once, in some hour
    duty = EXCERPTS["genai-gpu-duty-cycle-mean"].path.read_text().splitlines()
    assert duty[0] == "timestamp_anon,value,pods"
    assert all(0.0 <= float(line.split(",")[1]) <= 100.0 for line in duty[1:])


def test_traces_folder_comes_from_flag_then_environment_then_xdg(tmp_path: Path) -> None:
    env = {"AUTOGLM_TRACES_DIR": str(tmp_path / "env"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert traces_dir(tmp_path / "flag", env) == tmp_path / "flag"
    assert traces_dir(None, env) == tmp_path / "env"
    assert traces_dir(None, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == (
        tmp_path / "xdg/autoglm/traces"
    )
    assert traces_dir(None, {}) == Path.home() / ".cache/autoglm/traces"


def test_resolve_takes_a_path_an_excerpt_or_a_fetched_trace(tmp_path: Path) -> None:
    own = tmp_path / "genai-requests"  # a real file that shares a trace's name wins
    own.write_text("x")
    assert resolve(own) == own
    assert resolve("azure-llm-conv-10min") == EXCERPTS["azure-llm-conv-10min"].path
    cache = tmp_path / "cache"
    with pytest.raises(DatasetError, match="autoglm datasets fetch genai-qps"):
        resolve("genai-qps", cache)
    fetched = cache / TRACES["genai-qps"].relative_path
    fetched.parent.mkdir(parents=True)
    fetched.write_bytes(b"")
    assert resolve("genai-qps", cache) == fetched
    with pytest.raises(DatasetError, match=r"does not exist.*autoglm datasets list"):
        resolve(tmp_path / "nothing.csv")


def test_fetch_downloads_verifies_and_reports_progress(
    tmp_path: Path, mirror: tuple[Mirror, Path]
) -> None:
    server, root = mirror
    content = b"TIMESTAMP,value\n" + b"".join(b"%d,%d\n" % (i, i % 7) for i in range(40000))
    trace = small_trace(root, content)
    seen: list[tuple[int, int]] = []
    path, downloaded = fetch(
        trace, tmp_path / "cache", server.url, lambda d, t: seen.append((d, t))
    )
    assert downloaded and path.read_bytes() == content
    assert path == tmp_path / "cache/tiny-set/tiny.csv"
    assert len(seen) > 1 and seen[-1] == (len(content), len(content))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert not list(path.parent.glob("*.part"))
    again, downloaded = fetch(trace, tmp_path / "cache", server.url)
    assert again == path and not downloaded and server.requests == 1  # a good copy is kept


def test_fetch_keeps_nothing_that_fails_its_checksum(
    tmp_path: Path, mirror: tuple[Mirror, Path]
) -> None:
    server, root = mirror
    trace = small_trace(root)
    (root / "tiny-set/tiny.csv").write_bytes(b"TIMESTAMP,value\n1,3\n")  # upstream changed
    with pytest.raises(DatasetError, match=r"SHA-256 .* nothing was kept"):
        fetch(trace, tmp_path / "cache", server.url)
    assert not any((tmp_path / "cache/tiny-set").iterdir())
    # a damaged copy already in the cache is replaced, not trusted
    (root / "tiny-set/tiny.csv").write_bytes(b"TIMESTAMP,value\n1,2\n")
    (tmp_path / "cache/tiny-set/tiny.csv").write_bytes(b"damaged")
    path, downloaded = fetch(trace, tmp_path / "cache", server.url)
    assert downloaded and path.read_bytes() == b"TIMESTAMP,value\n1,2\n"


def test_fetch_from_an_unreachable_source_names_the_fix(tmp_path: Path) -> None:
    trace = small_trace(tmp_path)
    with pytest.raises(DatasetError, match=r"cannot download .* --mirror"):
        fetch(trace, tmp_path / "cache", "http://127.0.0.1:9/none", timeout=5)


def test_cli_fetch_verify_path_and_list(
    tmp_path: Path,
    mirror: tuple[Mirror, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, root = mirror
    trace = small_trace(root)
    monkeypatch.setitem(catalog.TRACES, "tiny", trace)
    cache = str(tmp_path / "cache")
    assert main(["verify", "tiny", "--cache-dir", cache]) == 1  # asked for, missing
    assert "tiny: missing" in capsys.readouterr().out
    assert main(["path", "tiny", "--cache-dir", cache]) == 1
    assert "autoglm datasets fetch tiny" in capsys.readouterr().err

    assert main(["fetch", "tiny", "--cache-dir", cache, "--mirror", server.url]) == 0
    out = capsys.readouterr()
    assert "tiny: downloaded and verified" in out.out and "tiny: 100% of" in out.err
    assert main(["path", "tiny", "--cache-dir", cache]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cache/tiny-set/tiny.csv")
    assert main(["verify", "tiny", "--cache-dir", cache]) == 0
    assert "tiny: ok" in capsys.readouterr().out

    (tmp_path / "cache/tiny-set/tiny.csv").write_bytes(b"edited")
    assert main(["verify", "--cache-dir", cache]) == 1  # a wrong checksum always fails
    assert "tiny: MISMATCH" in capsys.readouterr().out
    assert main(["list", "--long", "--cache-dir", cache]) == 0
    listing = capsys.readouterr().out
    assert "tiny" in listing and TRACES["genai-requests"].url in listing
    assert "genai-requests-hourly" in listing


def test_cli_unknown_trace_is_one_line_naming_the_choices(capsys: pytest.CaptureFixture[str]):
    for command in ("fetch", "verify"):
        assert main([command, "no-such-trace"]) == 2  # a usage error, not a missing trace
        err = capsys.readouterr().err
        assert "no trace named 'no-such-trace'" in err and "genai-requests" in err
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("mirror", "words"),
    [
        ("not a url", "--mirror 'not a url' must be an http://, https:// URL with a host"),
        ("ftp://example.org/traces", "file:// URL"),
        ("http://", "must be an http://"),
        ("http://[::1", "is not a valid URL"),
        ("http://host:99999/traces", "is not a valid URL"),
    ],
)
def test_cli_a_bad_mirror_is_one_line_and_exit_2_before_any_download(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mirror: str,
    words: str,
) -> None:
    monkeypatch.setitem(catalog.TRACES, "tiny", small_trace(tmp_path))
    cache = tmp_path / "cache"
    assert main(["fetch", "tiny", "--cache-dir", str(cache), "--mirror", mirror]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not cache.exists()


def test_fetch_with_a_bad_mirror_is_a_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="--mirror 'not a url'"):
        fetch(small_trace(tmp_path), tmp_path / "cache", "not a url")


def test_cli_a_cache_dir_that_is_a_file_is_one_line_and_exit_2(
    tmp_path: Path,
    mirror: tuple[Mirror, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, root = mirror
    monkeypatch.setitem(catalog.TRACES, "tiny", small_trace(root))
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    for cache in (a_file, a_file / "below"):
        argv = ["fetch", "tiny", "--cache-dir", str(cache), "--mirror", server.url]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert str(cache) in err and len(err.strip().splitlines()) == 1, err
    assert server.requests == 0  # nothing was downloaded
    assert a_file.read_text() == "not a folder"


def test_fetch_into_a_folder_that_cannot_be_made_is_a_dataset_error(
    tmp_path: Path, mirror: tuple[Mirror, Path]
) -> None:
    """The trace's own subfolder is a file: the error says so, the cleanup does not raise."""
    server, root = mirror
    trace = small_trace(root)
    cache = tmp_path / "cache"
    (cache / trace.relative_path).parent.parent.mkdir(parents=True, exist_ok=True)
    (cache / trace.relative_path).parent.write_text("in the way")
    with pytest.raises(DatasetError, match=r"cannot download .* into"):
        fetch(trace, cache, server.url)


def test_umbrella_command_reaches_datasets() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "autoglm.cli", "datasets", "path", "genai-requests-hourly"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(EXCERPTS["genai-requests-hourly"].path)


def test_exporter_profile_takes_an_excerpt_name() -> None:
    """A trace-driven simulated GPU works in a clone without the whole trace."""
    profile = load_profile("trace:genai-gpu-duty-cycle-mean:speed=57")
    first = float(
        EXCERPTS["genai-gpu-duty-cycle-mean"].path.read_text().splitlines()[1].split(",")[1]
    )
    assert profile.utilization(0.0, 0.0, 0) == pytest.approx(first / 100.0)

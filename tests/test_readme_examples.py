"""The commands README.md and docs/*.md show, run as a reader would run them.

Every fenced block whose info string starts with ``bash example`` is one test. The words after
``example`` say how to run it (docs/development.md lists them for writers):

* ``serve=PORT``: the block's first command starts a server that keeps running, the rest talk to
  it (a reader runs them in a second terminal). The test replaces PORT everywhere in the block by
  a free port, starts the server, waits until it accepts connections, runs the rest, then stops
  the server with SIGTERM and expects it to exit 0.
* ``ready=PATH``: with ``serve``, the rest waits until ``GET PATH`` answers 200 too (a server
  that listens before it has anything to serve, as the exporter before its first collection;
  a reader's second terminal takes longer than that).
* ``timeout=S``: the block must finish within S seconds (default 60).
* ``slow``: the block belongs to the slow tier (as every ``serve`` block does).
* ``requires=BINARY``: skipped, naming BINARY, when it is not on the PATH.

Blocks run with ``bash -euo pipefail`` from the repository root, with the interpreter running
the tests first on the PATH, so ``python`` and the console scripts are the ones under test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "example"
DEFAULT_TIMEOUT = 60.0
SERVER_READY_TIMEOUT = 120.0

FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```bash[ \t]+(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Example:
    """One marked block: where it is, what it runs and how."""

    document: Path
    line: int
    body: str
    serve: int | None = None
    ready: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    slow: bool = False
    requires: str | None = None

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def parse_examples(document: Path) -> list[Example]:
    """The ``bash example`` blocks of ``document``, their indentation removed."""
    text = document.read_text()
    found = []
    for match in FENCE.finditer(text):
        words = match["info"].split()
        if not words or words[0] != MARKER:
            continue
        options = dict(word.partition("=")[::2] for word in words[1:])
        unknown = set(options) - {"serve", "ready", "timeout", "slow", "requires"}
        assert not unknown, f"{document.name}: unknown example words {sorted(unknown)}"
        indent = len(match["indent"])
        body = "".join(line[indent:] for line in match["body"].splitlines(keepends=True))
        found.append(
            Example(
                document=document,
                line=text.count("\n", 0, match.start()) + 1,
                body=body,
                serve=int(options["serve"]) if options.get("serve") else None,
                ready=options.get("ready") or None,
                timeout=float(options.get("timeout") or DEFAULT_TIMEOUT),
                slow="slow" in options,
                requires=options.get("requires") or None,
            )
        )
    return found


def commands(body: str) -> list[str]:
    """Shell commands of a block, one per logical line (backslash continuations joined)."""
    joined = re.sub(r"\\\n", " ", body)
    return [
        line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def run_block(script: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for_port(port: int, server: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited with {server.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the server did not listen on {port} in {SERVER_READY_TIMEOUT:.0f} s")


def wait_for_ready(url: str, server: subprocess.Popen, deadline: float) -> None:
    """Until ``url`` answers 200 (the server says it has something to serve)."""
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited with {server.returncode} before ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:  # refused, or an HTTP error status (503 until ready)
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer 200 in {SERVER_READY_TIMEOUT:.0f} s")


def stop(server: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM to the server's process group; its exit code and what it wrote."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
    try:
        output, _ = server.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        output, _ = server.communicate()
        return -signal.SIGKILL, output
    return server.returncode, output


def run_with_server(example: Example) -> None:
    port = free_port()
    body = re.sub(rf"(?<!\d){example.serve}(?!\d)", str(port), example.body)
    first, *rest = commands(body)
    assert str(port) in first, (
        f"{example.name}: serve={example.serve} but the first command does not name that port; "
        "write it out (e.g. --listen :PORT) so a reader sees where it serves"
    )
    server = subprocess.Popen(
        ["bash", "-c", f"exec {first}"],
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + SERVER_READY_TIMEOUT
        wait_for_port(port, server, deadline)
        if example.ready:
            wait_for_ready(f"http://127.0.0.1:{port}{example.ready}", server, deadline)
        result = run_block("\n".join(rest), example.timeout)
    finally:
        code, server_output = stop(server)
    assert result.returncode == 0, (
        f"{example.name} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )
    assert code == 0, f"{example.name}: the server exited with {code}:\n{server_output[-3000:]}"


def all_examples() -> list[pytest.param]:
    params = []
    for document in DOCUMENTS:
        for example in parse_examples(document):
            marks = [pytest.mark.timeout(example.timeout + SERVER_READY_TIMEOUT + 60)]
            if example.slow or example.serve is not None:  # a real server is the slow tier
                marks.append(pytest.mark.slow)
            if example.requires:
                missing = shutil.which(example.requires) is None
                reason = f"needs {example.requires} on the PATH (bash scripts/test installs it)"
                marks.append(pytest.mark.skipif(missing, reason=reason))
            params.append(pytest.param(example, id=example.name, marks=marks))
    return params


EXAMPLES = all_examples()


def test_the_readme_and_docs_mark_their_runnable_commands():
    readme = [e for e in EXAMPLES if e.values[0].document.name == "README.md"]
    assert len(readme) >= 3, "README.md lost its marked examples"


def test_the_readme_test_command_is_what_ci_runs():
    """The first test command a reader meets must be the one .ci/run runs."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"^\s*(python3? -m pytest|pytest|make test|bash [^ ]*test)\S*.*$", text, re.M)
    assert first is not None
    assert first.group(0).strip() in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs(example: Example) -> None:
    if example.serve is not None:
        run_with_server(example)
        return
    result = run_block(example.body, example.timeout)
    assert result.returncode == 0, (
        f"{example.name} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )


LINK = re.compile(r"\]\((?P<target>[^)\s#]*)(?:#(?P<anchor>[^)\s]*))?\)")


def anchors(document: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCED.sub("", document.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(d.relative_to(ROOT)) for d in DOCUMENTS])
def test_links_between_pages_resolve(document: Path) -> None:
    broken = []
    for match in LINK.finditer(FENCED.sub("", document.read_text())):
        target, anchor = match["target"], match["anchor"]
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        page = (document.parent / target).resolve() if target else document
        if not page.exists():
            broken.append(f"{target}: no such file")
        elif anchor and page.suffix == ".md" and anchor not in anchors(page):
            broken.append(f"{target}#{anchor}: no such heading")
    assert not broken, f"{document.relative_to(ROOT)}: {broken}"


def test_the_index_links_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {m["target"] for m in LINK.finditer(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs/index.md does not link {sorted(pages - linked)}"


def test_anchors_follow_githubs_rule(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## How it collects, and what differs: `dcgm`\n\n```\n# not a heading\n```\n"
    )
    assert anchors(page) == {"title", "how-it-collects-and-what-differs-dcgm"}

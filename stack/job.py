"""The demo's best-effort job: a backlog of requests sent through the job runner on idle capacity.

What a data engineer would run on the fleet (``autoglm job run``: nightly embeddings, an
evaluation) is played here by a generated JSONL file of KServe v2 requests for the demo model,
written in the run's folder. The job runner (:func:`jobs.runner.run_job`, the library form of
``autoglm job run``) sends it through the local Service (:mod:`stack.service`) as
best-effort traffic: the batchers serve it only on capacity the online requests leave idle and
refuse it (429) otherwise, and the runner adapts. So the backlog never runs dry in a run of any
length, the job runs again over the same input when it ends, each round answering into a file
of its own. The runner's metrics are served for Prometheus as ``autoglm_job_*``.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from jobs.config import JobConfig
from jobs.runner import run_job
from stack.loadgen import FEATURES

log = logging.getLogger(__name__)

JOB_NAME = "demo-backlog"
LINES_PER_ROUND = 5000
OK_LINES = "autoglm_job_lines_total"


def request_lines(count: int, seed: int = 0) -> Iterator[str]:
    """``count`` JSONL lines, each one KServe v2 request of one item for the demo model."""
    rng = random.Random(seed)
    for n in range(count):
        data = [round(rng.uniform(-1.0, 1.0), 4) for _ in range(FEATURES)]
        request = {
            "id": f"item-{n}",
            "inputs": [{"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": data}],
        }
        yield json.dumps(request, separators=(",", ":"))


def write_requests(path: Path, count: int, seed: int = 0) -> Path:
    """Write the job's input file; its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for line in request_lines(count, seed):
            handle.write(line + "\n")
    return path


class CurrentRound(Collector):
    """The metrics of the round running now (each run of the job counts from zero)."""

    def __init__(self) -> None:
        self.registry: CollectorRegistry | None = None

    def collect(self):
        registry = self.registry
        if registry is not None:
            yield from registry.collect()


class BestEffortJob:
    """Runs the job in rounds on a background thread until :meth:`stop`."""

    def __init__(
        self, directory: Path, endpoint: str, model: str, lines: int = LINES_PER_ROUND
    ) -> None:
        self.directory, self.endpoint, self.model, self.lines = directory, endpoint, model, lines
        self.input = directory / "requests.jsonl"
        self.metrics = CurrentRound()
        self.registry = CollectorRegistry()
        self.registry.register(self.metrics)
        self.rounds = 0
        self.error: str | None = None
        self._done_before = 0  # lines answered by the finished rounds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def config(self, round_index: int) -> JobConfig:
        """Settings of one round; every file in the job's folder."""
        output = self.directory / f"answers-{round_index}.jsonl"
        return JobConfig(
            input=str(self.input),
            output=str(output),
            endpoint=self.endpoint,
            model=self.model,
            job_name=JOB_NAME,
            shard_index=0,
            progress="off",
            log_level="warning",
        )

    def prepare(self) -> None:
        """Write the input (over any earlier run's job files, which would otherwise be resumed)
        and check the first round's settings, before any work."""
        shutil.rmtree(self.directory, ignore_errors=True)
        write_requests(self.input, self.lines)
        self.config(1)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="autoglm-up-job", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    def done(self) -> int:
        """Lines answered so far, over every round."""
        with self._lock:
            registry, before = self.metrics.registry, self._done_before
        if registry is None:
            return before
        current = registry.get_sample_value(OK_LINES, {"job_name": JOB_NAME, "outcome": "ok"})
        return before + int(current or 0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.rounds += 1
            registry = CollectorRegistry()
            self.metrics.registry = registry
            try:
                summary = run_job(self.config(self.rounds), stop=self._stop, registry=registry)
            except Exception as exc:  # the demo goes on without its job; the summary says so
                log.exception("best-effort job failed")
                self.error = str(exc)
                return
            with self._lock:
                self._done_before += summary.ok
                self.metrics.registry = None
            if self._stop.is_set():
                return
            if summary.stopped or summary.ok == 0:
                self.error = f"the job stopped: {summary.stopped or 'no line was answered'}"
                log.warning("best-effort job stopped", extra={"reason": self.error})
                return

"""What a run of ``autoglm up`` leaves behind: a summary and an HTML report with plots.

The stack records one :class:`Sample` a second and one :class:`ScaleEvent` per rescale. From
those, :func:`summarize` computes what the run achieved: SLO attainment (requests answered
correctly within the SLO, out of all sent, shed ones included), GPU-seconds (each worker holds
one GPU while it exists), the mean utilization of those GPUs, and the scale events.
:func:`write_report` writes ``report.html`` (plots embedded as base64 PNG, so the file stands
alone) and ``summary.json`` (the same numbers and the decision log, for scripts and tests).
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autoglm.up.loadgen import Totals


@dataclass(frozen=True)
class Sample:
    """The stack's state at one instant (``elapsed`` seconds after the load started)."""

    elapsed: float
    target_rps: float
    sent_rps: float
    workers: int  # processes that exist (each holds a GPU)
    ready_workers: int
    desired_workers: int
    mean_utilization: float | None  # percent, over ready workers
    total_busy: float | None  # sum of the workers' utilization, percent (100 = one GPU busy)
    forecast_upper: float | None  # forecast of total_busy at the horizon (upper bound)
    forecast_for: float | None  # the elapsed time the forecast is for
    p99_seconds: float | None  # client-side, over the last seconds


@dataclass(frozen=True)
class ScaleEvent:
    elapsed: float
    from_workers: int
    to_workers: int
    driver: str
    reason: str

    @property
    def direction(self) -> str:
        return "up" if self.to_workers > self.from_workers else "down"


@dataclass
class Summary:
    duration_seconds: float
    requests_sent: int
    requests_ok: int
    outcomes: dict[str, int]
    slo_seconds: float
    slo_attainment: float | None
    p99_seconds: float | None
    gpu_seconds: float
    mean_utilization: float | None
    target_utilization: float
    scale_ups: int
    scale_downs: int
    peak_workers: int
    scale_events: list[dict] = field(default_factory=list)


def summarize(
    samples: Sequence[Sample],
    events: Sequence[ScaleEvent],
    totals: Totals,
    slo_seconds: float,
    target_utilization: float,
    p99_seconds: float | None,
) -> Summary:
    """The run's figures; GPU-seconds and mean utilization integrate the samples over time."""
    gpu_seconds = 0.0
    busy_seconds = 0.0
    counted_seconds = 0.0
    for before, after in itertools.pairwise(samples):
        dt = after.elapsed - before.elapsed
        gpu_seconds += before.workers * dt
        if before.mean_utilization is not None and before.ready_workers:
            busy_seconds += before.mean_utilization / 100.0 * before.ready_workers * dt
            counted_seconds += before.ready_workers * dt
    return Summary(
        duration_seconds=samples[-1].elapsed if samples else 0.0,
        requests_sent=totals.sent,
        requests_ok=totals.by_outcome.get("ok", 0),
        outcomes=dict(totals.by_outcome),
        slo_seconds=slo_seconds,
        slo_attainment=totals.attainment,
        p99_seconds=p99_seconds,
        gpu_seconds=gpu_seconds,
        mean_utilization=100.0 * busy_seconds / counted_seconds if counted_seconds else None,
        target_utilization=target_utilization,
        scale_ups=sum(1 for e in events if e.direction == "up"),
        scale_downs=sum(1 for e in events if e.direction == "down"),
        peak_workers=max((s.workers for s in samples), default=0),
        scale_events=[{**asdict(e), "direction": e.direction} for e in events],
    )


def summary_lines(summary: Summary) -> list[str]:
    """The summary as aligned lines for the terminal."""

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1f} %"

    mean_workers = summary.gpu_seconds / summary.duration_seconds if summary.duration_seconds else 0
    p99 = "n/a" if summary.p99_seconds is None else f"{summary.p99_seconds:.3f} s"
    attainment = None if summary.slo_attainment is None else 100 * summary.slo_attainment
    failed = {k: v for k, v in summary.outcomes.items() if k != "ok" and v}
    return [
        f"requests          {summary.requests_sent} sent, {summary.requests_ok} answered"
        + (f" ({', '.join(f'{v} {k}' for k, v in failed.items())})" if failed else ""),
        f"SLO attainment    {pct(attainment)} answered within {summary.slo_seconds:g} s",
        f"p99 latency       {p99}",
        f"GPU-seconds       {summary.gpu_seconds:.0f} (mean {mean_workers:.2f} workers, "
        f"peak {summary.peak_workers})",
        f"mean utilization  {pct(summary.mean_utilization)} "
        f"(target {summary.target_utilization:g} %)",
        f"scale events      {summary.scale_ups} up, {summary.scale_downs} down",
    ]


def _plots(samples: Sequence[Sample], events: Sequence[ScaleEvent], summary: Summary) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.elapsed for s in samples]

    def series(values: Sequence[float | None]) -> list[float]:
        return [math.nan if v is None else v for v in values]

    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    ax = axes[0]
    ax.plot(t, [s.target_rps for s in samples], label="profile (target rate)", color="0.6")
    ax.plot(t, [s.sent_rps for s in samples], label="sent", color="tab:blue")
    ax.set_ylabel("requests / s")
    ax.set_title("Load")
    ax.legend(loc="upper left")

    ax = axes[1]
    ax.plot(t, series([s.total_busy for s in samples]), label="observed", color="tab:blue")
    forecast = [(s.forecast_for, s.forecast_upper) for s in samples if s.forecast_upper is not None]
    if forecast:
        ax.plot(
            [f[0] for f in forecast],
            [f[1] for f in forecast],
            label="forecast upper bound (plotted at the time it predicts)",
            color="tab:orange",
            linestyle="--",
        )
    ax.set_ylabel("GPU work (100 = one GPU busy)")
    ax.set_title("Work and its forecast")
    ax.legend(loc="upper left")

    ax = axes[2]
    ax.step(t, [s.workers for s in samples], where="post", label="workers", color="tab:blue")
    ax.step(t, [s.ready_workers for s in samples], where="post", label="ready", color="tab:green")
    for e in events:
        ax.axvline(e.elapsed, color="tab:red" if e.direction == "up" else "tab:purple", alpha=0.3)
    ax.set_ylabel("workers (GPUs)")
    ax.set_title("Replicas (vertical lines: scale events)")
    ax.legend(loc="upper left")

    ax = axes[3]
    ax.plot(t, series([s.mean_utilization for s in samples]), label="mean GPU utilization %")
    ax.axhline(summary.target_utilization, color="tab:blue", linestyle=":", label="target %")
    ax.set_ylabel("percent")
    ax.set_ylim(0, 105)
    twin = ax.twinx()
    twin.plot(t, series([s.p99_seconds for s in samples]), color="tab:red", label="p99 latency (s)")
    twin.axhline(summary.slo_seconds, color="tab:red", linestyle=":", label="SLO (s)")
    twin.set_ylabel("seconds")
    ax.set_title("Utilization against target, p99 latency against SLO")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    axes[-1].set_xlabel("seconds since the load started")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def render_html(
    samples: Sequence[Sample], events: Sequence[ScaleEvent], summary: Summary, title: str
) -> str:
    png = base64.b64encode(_plots(samples, events, summary)).decode()
    rows = "".join(f"<tr><td>{html.escape(line)}</td></tr>" for line in summary_lines(summary))
    event_rows = "".join(
        f"<tr><td>{e.elapsed:.0f} s</td><td>{e.from_workers} &rarr; {e.to_workers}</td>"
        f"<td>{html.escape(e.driver)}</td><td>{html.escape(e.reason)}</td></tr>"
        for e in events
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
pre, td {{ font-family: ui-monospace, monospace; font-size: 14px; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
td, th {{ padding: 2px 10px; text-align: left; border-bottom: 1px solid #eee; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<table>{rows}</table>
<img alt="load, forecast, replicas, utilization and latency over time"
     src="data:image/png;base64,{png}">
<h2>Scale events</h2>
<table><tr><th>time</th><th>workers</th><th>driver</th><th>reason</th></tr>{event_rows}</table>
</body></html>
"""


def write_report(
    directory: str | Path,
    samples: Sequence[Sample],
    events: Sequence[ScaleEvent],
    summary: Summary,
    title: str = "autoglm up: run report",
) -> Path:
    """Write ``report.html`` and ``summary.json`` into ``directory``; the report's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.html"
    report.write_text(render_html(samples, events, summary, title))
    data = {
        **asdict(summary),
        "samples": [asdict(s) for s in samples],
    }
    (out / "summary.json").write_text(json.dumps(data, indent=1))
    return report.resolve()

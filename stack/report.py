"""What a run of ``autoglm up`` leaves behind: a summary and an HTML report with plots.

The stack records one :class:`Sample` a second and one :class:`ScaleEvent` per rescale. From
those, :func:`summarize` computes what the run achieved: SLO attainment (online requests answered
correctly within the SLO, out of all sent, shed ones included), the paid GPU-seconds (each worker
holds one GPU while it exists, starting and idle included) and how busy they were -- with online
requests, with the best-effort job, and both together -- the best-effort work done, the mean
online utilization of the ready workers (what the autoscaler holds at its target) and the scale
events. :func:`write_report` writes ``report.html`` (plots embedded as base64 PNG, so the file
stands alone) and ``summary.json`` (the same numbers and the decision log, for scripts and tests).
:func:`check_report_dir` makes sure both can be written before a run starts.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autoglm.config import ConfigError
from stack.loadgen import Totals
from stack.paid_time import STATES, PaidTime, breakdown, by_phase

REPORT_FILES = ("report.html", "summary.json")
# A load generator this late against its schedule gets a line in the summary: below it, the
# arrivals' own jitter on a busy event loop.
GENERATOR_BEHIND_SHOWN_SECONDS = 0.1


@dataclass(frozen=True)
class Sample:
    """The stack's state at one instant (``elapsed`` seconds after the load started).

    Work is in percent of one GPU (100 = one GPU busy), summed over the workers."""

    elapsed: float
    target_rps: float
    sent_rps: float
    workers: int  # processes that exist (each holds a GPU)
    ready_workers: int
    desired_workers: int
    online_utilization: float | None  # percent, mean over ready workers: what the target is for
    online_work: float | None
    best_effort_work: float | None
    best_effort_done: int  # job lines answered since the start
    forecast_upper: float | None  # at the horizon (upper bound): of online_work, or of the
    # request rate with --sizing slo
    forecast_for: float | None  # the elapsed time the forecast is for
    p99_seconds: float | None  # client-side, online requests, over the last seconds
    # idle GPU time of the ready workers whose batcher held best-effort work at zero (throttled)
    # or at part of the device's time (share cut): why the job did not fill it
    idle_throttled_work: float | None = None
    idle_share_cut_work: float | None = None

    @property
    def busy_share(self) -> float | None:
        """Share of the paid GPUs busy now, online and best-effort together (0..1)."""
        if not self.workers or self.online_work is None:
            return None
        return (self.online_work + (self.best_effort_work or 0.0)) / (100.0 * self.workers)


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
    slo_attainment: float | None  # online requests within the SLO, out of all sent
    p99_seconds: float | None
    gpu_seconds: float  # paid: every worker from its start to its stop
    busy_share: float | None  # of the paid GPU-seconds, online and best-effort together
    online_busy_share: float | None
    best_effort_busy_share: float | None
    best_effort_done: int  # job lines answered
    online_utilization: float | None  # percent, mean over ready workers
    target_utilization: float  # ratio, as the flag
    sizing: str  # as --sizing: what the forecast is of (online work, or the rate for "slo")
    scale_ups: int
    scale_downs: int
    peak_workers: int
    load_average: tuple[float, float, float] | None = None  # the machine's, at the end
    # of the paid GPU-seconds, the share spent on workers not ready yet (starting: no work fits)
    starting_share: float | None = None
    # the stack's processes: seconds runnable but waiting for a CPU core, per second on one
    cpu_wait_per_run: float | None = None
    # the latest a request left against the load profile's schedule (a starved load generator)
    generator_behind_seconds: float | None = None
    # online requests within the SLO by the batchers' own clock, out of those they answered or
    # refused (None without Prometheus): the product's part of slo_attainment
    batcher_slo_attainment: float | None = None
    # of the paid GPU-seconds, the share idle on ready workers: with best-effort work throttled
    # (online p99 near the SLO), with its share cut, or allowed (the job did not fill it)
    idle_throttled_share: float | None = None
    idle_share_cut_share: float | None = None
    idle_allowed_share: float | None = None
    # per phase of the load (steady, rising, falling): its seconds, paid GPU-seconds and the
    # share of them in each state (stack.paid_time)
    phases: dict[str, dict[str, float | None]] = field(default_factory=dict)
    scale_events: list[dict] = field(default_factory=list)


def summarize(
    samples: Sequence[Sample],
    events: Sequence[ScaleEvent],
    totals: Totals,
    slo_seconds: float,
    target_utilization: float,
    p99_seconds: float | None,
    load_average: tuple[float, float, float] | None = None,
    sizing: str = "utilization",
    cpu_wait_per_run: float | None = None,
    batcher_slo_attainment: float | None = None,
    generator_behind_seconds: float | None = None,
) -> Summary:
    """The run's figures; GPU-seconds, busy time and utilization integrate the samples."""
    paid = breakdown(samples)
    ready_busy = ready_seconds = 0.0
    for before, after in itertools.pairwise(samples):
        dt = after.elapsed - before.elapsed
        if before.online_utilization is not None and before.ready_workers:
            ready_busy += before.online_utilization / 100.0 * before.ready_workers * dt
            ready_seconds += before.ready_workers * dt

    return Summary(
        duration_seconds=samples[-1].elapsed if samples else 0.0,
        requests_sent=totals.sent,
        requests_ok=totals.by_outcome.get("ok", 0),
        outcomes=dict(totals.by_outcome),
        slo_seconds=slo_seconds,
        slo_attainment=totals.attainment,
        p99_seconds=p99_seconds,
        gpu_seconds=paid.gpu_seconds,
        busy_share=(paid.online + paid.best_effort) / paid.gpu_seconds
        if paid.gpu_seconds
        else None,
        online_busy_share=paid.share("online"),
        best_effort_busy_share=paid.share("best_effort"),
        best_effort_done=samples[-1].best_effort_done if samples else 0,
        online_utilization=100.0 * ready_busy / ready_seconds if ready_seconds else None,
        target_utilization=target_utilization,
        sizing=sizing,
        scale_ups=sum(1 for e in events if e.direction == "up"),
        scale_downs=sum(1 for e in events if e.direction == "down"),
        peak_workers=max((s.workers for s in samples), default=0),
        load_average=load_average,
        starting_share=paid.share("starting"),
        cpu_wait_per_run=cpu_wait_per_run,
        generator_behind_seconds=generator_behind_seconds,
        batcher_slo_attainment=batcher_slo_attainment,
        idle_throttled_share=paid.share("idle_throttled"),
        idle_share_cut_share=paid.share("idle_share_cut"),
        idle_allowed_share=paid.share("idle_allowed"),
        phases={name: phase_figures(part) for name, part in by_phase(samples).items()},
        scale_events=[{**asdict(e), "direction": e.direction} for e in events],
    )


def phase_figures(part: PaidTime) -> dict[str, float | None]:
    """One phase's entry in the summary: its seconds, paid GPU-seconds and share per state."""
    return {
        "seconds": part.seconds,
        "gpu_seconds": part.gpu_seconds,
        **{f"{state}_share": part.share(state) for state in STATES},
    }


def idle_share(summary: Summary) -> float | None:
    """The share of the paid GPU-time idle on ready workers, for whatever reason."""
    parts = (summary.idle_throttled_share, summary.idle_share_cut_share, summary.idle_allowed_share)
    return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)


def phase_line(name: str, figures: dict[str, float | None]) -> str:
    """One phase of the load on one line: how long, what it paid, where the time went."""

    def pct(state: str) -> str:
        value = figures.get(f"{state}_share")
        return "n/a" if value is None else f"{100 * value:.1f} %"

    online, best_effort = figures.get("online_share"), figures.get("best_effort_share")
    busy = None if online is None or best_effort is None else online + best_effort
    return (
        f"  {name:<8}        {figures['seconds']:.0f} s, {figures['gpu_seconds']:.0f} GPU-s: "
        f"busy {'n/a' if busy is None else f'{100 * busy:.1f} %'}, starting {pct('starting')}, "
        f"idle throttled {pct('idle_throttled')}, share cut {pct('idle_share_cut')}, "
        f"allowed {pct('idle_allowed')}"
    )


def summary_lines(summary: Summary) -> list[str]:
    """The summary as aligned lines for the terminal."""

    def pct(x: float | None, scale: float = 100.0) -> str:
        return "n/a" if x is None else f"{scale * x:.1f} %"

    mean_workers = summary.gpu_seconds / summary.duration_seconds if summary.duration_seconds else 0
    p99 = "n/a" if summary.p99_seconds is None else f"{summary.p99_seconds:.3f} s"
    failed = {k: v for k, v in summary.outcomes.items() if k != "ok" and v}
    lines = [
        f"online requests   {summary.requests_sent} sent, {summary.requests_ok} answered"
        + (f" ({', '.join(f'{v} {k}' for k, v in failed.items())})" if failed else ""),
        f"SLO attainment    {pct(summary.slo_attainment)} of online requests answered within "
        f"{summary.slo_seconds:g} s"
        + (
            f" ({pct(summary.batcher_slo_attainment)} by the batchers' own clock)"
            if summary.batcher_slo_attainment is not None
            else ""
        ),
        f"p99 latency       {p99} (online)",
        f"GPU-seconds       {summary.gpu_seconds:.0f} paid (mean {mean_workers:.2f} workers, "
        f"peak {summary.peak_workers})",
        f"busy              {pct(summary.busy_share)} of paid GPU-time "
        f"(online {pct(summary.online_busy_share)}, "
        f"best-effort {pct(summary.best_effort_busy_share)}; "
        f"{pct(summary.starting_share)} was workers starting)",
        f"idle              {pct(idle_share(summary))} of paid GPU-time on ready workers: "
        f"{pct(summary.idle_throttled_share)} with best-effort throttled (online p99 near the "
        f"SLO), {pct(summary.idle_share_cut_share)} with its share cut, "
        f"{pct(summary.idle_allowed_share)} with best-effort allowed",
        *(phase_line(name, figures) for name, figures in summary.phases.items()),
        f"best-effort work  {summary.best_effort_done} job requests answered",
        f"utilization       {pct(summary.online_utilization, 1.0)} online, mean over ready "
        + (
            f"workers (sized for the p99 within {summary.slo_seconds:g} s: --sizing slo)"
            if summary.sizing == "slo"
            else f"workers (target {pct(summary.target_utilization)})"
        ),
        f"scale events      {summary.scale_ups} up, {summary.scale_downs} down",
    ]
    if summary.load_average is not None:
        lines.append(
            "machine load      "
            + ", ".join(f"{x:.2f}" for x in summary.load_average)
            + " (1, 5, 15 min)"
        )
    if summary.cpu_wait_per_run is not None:
        lines.append(
            f"CPU wait          {summary.cpu_wait_per_run:.2f} s waiting for a core per second "
            "on one (the stack's processes; near 0 on an idle machine)"
        )
    behind = summary.generator_behind_seconds
    if behind is not None and behind >= GENERATOR_BEHIND_SHOWN_SECONDS:
        lines.append(
            f"load generator    up to {behind:.2f} s behind its schedule: the machine starved it, "
            "so the load came late and in bursts"
        )
    return lines


def check_report_dir(directory: str | Path) -> Path:
    """The report directory, created and proven writable now, so that a run is never lost at its
    end; ConfigError naming the problem otherwise."""
    path = Path(directory).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(
            f"--report-dir {str(directory)!r} is a file, not a directory; name a directory"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"--report-dir {str(directory)!r} cannot be created: {exc.strerror}; "
            "name a directory you can write to"
        ) from None
    for name in REPORT_FILES:
        target = path / name
        if target.exists() and not target.is_file():
            raise ConfigError(f"--report-dir: {target} exists and is not a file; remove it")
        if target.exists() and not os.access(target, os.W_OK):
            raise ConfigError(f"--report-dir: {target} cannot be overwritten; check permissions")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--report-dir {str(directory)!r} is not writable: {exc.strerror}; "
            "name a directory you can write to"
        ) from None
    return path


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
    forecast = [(s.forecast_for, s.forecast_upper) for s in samples if s.forecast_upper is not None]
    forecast_axis = 0 if summary.sizing == "slo" else 1  # the rate, or the online work
    ax.set_ylabel("requests / s")
    ax.set_title("Online load")

    ax = axes[1]
    online = series([s.online_work for s in samples])
    combined = [o + (s.best_effort_work or 0.0) for o, s in zip(online, samples, strict=True)]
    ax.fill_between(t, 0, online, label="online", color="tab:blue", alpha=0.5, step="post")
    ax.fill_between(
        t, online, combined, label="best-effort", color="tab:green", alpha=0.4, step="post"
    )
    layers = (
        ("starting worker", "0.5", [100.0 * (s.workers - s.ready_workers) for s in samples]),
        ("idle, best-effort throttled", "tab:red", [s.idle_throttled_work for s in samples]),
        ("idle, best-effort share cut", "tab:orange", [s.idle_share_cut_work for s in samples]),
    )
    bottom = combined
    for label, color, values in layers:
        top = [b + (v or 0.0) for b, v in zip(bottom, values, strict=True)]
        ax.fill_between(t, bottom, top, label=label, color=color, alpha=0.3, step="post")
        bottom = top
    ax.step(t, [100 * s.workers for s in samples], where="post", label="paid GPUs", color="0.3")
    ax.set_ylabel("GPU work (100 = one GPU busy)")
    ax.set_title("Paid GPUs: the work filling them and why the rest was idle")
    if forecast:
        axes[forecast_axis].plot(
            [f[0] for f in forecast],
            [f[1] for f in forecast],
            label="forecast, upper bound (at the time it predicts)",
            color="tab:orange",
            linestyle="--",
        )
    axes[0].legend(loc="upper left")
    # the legend in a band above the stack, where it hides none of it
    ax.set_ylim(0, 1.4 * max((100 * s.workers for s in samples), default=100))
    ax.legend(loc="upper center", ncol=4, fontsize="small")

    ax = axes[2]
    ax.step(t, [s.workers for s in samples], where="post", label="workers", color="tab:blue")
    ax.step(t, [s.ready_workers for s in samples], where="post", label="ready", color="tab:green")
    for e in events:
        ax.axvline(e.elapsed, color="tab:red" if e.direction == "up" else "tab:purple", alpha=0.3)
    ax.set_ylabel("workers (GPUs)")
    ax.set_title("Replicas (vertical lines: scale events)")
    ax.legend(loc="upper left")

    ax = axes[3]
    ax.plot(t, series([s.online_utilization for s in samples]), label="online utilization %")
    ax.axhline(100 * summary.target_utilization, color="tab:blue", linestyle=":", label="target %")
    busy = [None if s.busy_share is None else 100 * s.busy_share for s in samples]
    ax.plot(t, series(busy), color="tab:green", label="busy, with best-effort %")
    ax.set_ylabel("percent")
    ax.set_ylim(0, 105)
    twin = ax.twinx()
    twin.plot(t, series([s.p99_seconds for s in samples]), color="tab:red", label="p99 latency (s)")
    twin.axhline(summary.slo_seconds, color="tab:red", linestyle=":", label="SLO (s)")
    twin.set_ylabel("seconds")
    ax.set_title("Utilization against target, online p99 latency against SLO")
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

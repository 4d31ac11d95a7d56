"""Cost-quality frontiers: does a policy place capacity better, or only add more of it?

A policy that pays for more GPU-hours will usually breach the SLO less, whatever it predicts. To
tell better placement from more capacity, the reference policy (the HPA) is run at several
utilization targets, which traces its breach-minutes-versus-GPU-hours curve; a candidate point
lies below that curve when it breaches less than the HPA does at the same GPU-hours, read off by
linear interpolation between the two HPA points around it. Outside the HPA points' range nothing
is interpolated: such a point is reported as outside, not as better or worse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Verdict = Literal["below", "on_or_above", "outside"]


@dataclass(frozen=True)
class FrontierPoint:
    """One run: its policy, utilization target, cost and SLO breaches."""

    policy: str
    target: float
    gpu_hours: float
    breach_minutes: int


@dataclass(frozen=True)
class FrontierComparison:
    """A candidate point against the reference frontier.

    ``reference_breaches``: the reference's breach minutes interpolated at the candidate's
    GPU-hours (None outside the reference's range). ``reference_gpu_hours``: the GPU-hours the
    reference needs for the candidate's breach minutes, where its curve is monotone there (None
    otherwise); its ratio to the candidate's is the saving at equal quality.
    """

    point: FrontierPoint
    verdict: Verdict
    reference_breaches: float | None
    reference_gpu_hours: float | None


def compare(reference: Sequence[FrontierPoint], point: FrontierPoint) -> FrontierComparison:
    """Place ``point`` against the piecewise-linear frontier through ``reference``."""
    if len(reference) < 2:
        raise ValueError("a frontier needs at least two reference points (two targets)")
    ref = sorted(reference, key=lambda p: p.gpu_hours)
    cost = np.array([p.gpu_hours for p in ref])
    breaches = np.array([p.breach_minutes for p in ref], dtype=float)
    at_cost: float | None = None
    verdict: Verdict = "outside"
    if cost[0] <= point.gpu_hours <= cost[-1]:
        at_cost = float(np.interp(point.gpu_hours, cost, breaches))
        verdict = "below" if point.breach_minutes < at_cost else "on_or_above"
    at_quality: float | None = None
    # The inverse reading needs breaches falling as cost rises over the whole reference range.
    if np.all(np.diff(breaches) < 0) and breaches[-1] <= point.breach_minutes <= breaches[0]:
        at_quality = float(np.interp(point.breach_minutes, breaches[::-1], cost[::-1]))
    return FrontierComparison(point, verdict, at_cost, at_quality)


def plot_frontiers(
    panels: Mapping[str, Sequence[FrontierPoint]], path: str | Path, title: str = ""
) -> None:
    """Breach minutes against GPU-hours, one line per policy, one panel per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, (name, points) in zip(axes[0], panels.items(), strict=True):
        policies = dict.fromkeys(p.policy for p in points)
        for policy in policies:
            line = sorted((p for p in points if p.policy == policy), key=lambda p: p.gpu_hours)
            ax.plot(
                [p.gpu_hours for p in line],
                [p.breach_minutes for p in line],
                marker="o",
                label=policy,
            )
            for p in line:
                ax.annotate(
                    f"{p.target:g}",
                    (p.gpu_hours, p.breach_minutes),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                )
        ax.set_title(name)
        ax.set_xlabel("GPU-hours")
        ax.set_ylabel("SLO breach minutes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)

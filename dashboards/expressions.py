"""PromQL building blocks shared by the GPU dashboards.

dcgm-exporter (and this project's exporter) repeats a time-sliced GPU's series once per pod using
it; aggregates over GPUs must count each physical GPU once, hence ``max without`` the pod labels.
"""

from __future__ import annotations

from dashboards.variables import GPU_SELECTOR

POD_LABELS = "container, namespace, pod"
GPU_KEY = "Hostname, gpu, modelName"
GPU_LEGEND = "{{Hostname}} GPU {{gpu}}"
MIB = 1048576  # the DCGM framebuffer fields are in MiB; dashboards show bytes


def per_gpu(metric: str, selector: str = GPU_SELECTOR) -> str:
    """One series per physical GPU of ``metric``, filtered by the dashboard variables."""
    return f"max without ({POD_LABELS}) ({metric}{{{selector}}})"


def per_gpu_rate(metric: str, selector: str = GPU_SELECTOR) -> str:
    """Per-second rate of a counter, one series per physical GPU."""
    return f"max without ({POD_LABELS}) (rate({metric}{{{selector}}}[$__rate_interval]))"


def hours_over_range(ratio_expr: str) -> str:
    """GPU-hours: integrate a per-GPU ratio (0..1) over the dashboard range in 1-minute steps.

    A subquery at a fixed 1m step makes the sum independent of the scrape interval: each step
    counts one minute of whatever the GPU was doing, and a GPU absent for part of the range
    counts only while present.
    """
    return f"sum(sum_over_time(({ratio_expr})[$__range:1m])) / 60"


def new_or_increased(series: str, window: str) -> str:
    """Counter ``series`` that rose within ``window``, or that appeared within it.

    The exporter creates the counter of a non-critical Xid code with its first event, so it
    appears at 1 and ``increase`` (which needs two samples) cannot see that event; the
    ``unless ... offset`` branch catches it. (Critical codes start at 0, where ``increase``
    alone suffices, as the GPUCriticalXid rule uses.) The result is the increase, or the count
    when new.
    """
    return f"(increase({series}[{window}]) > 0) or ({series} unless {series} offset {window})"

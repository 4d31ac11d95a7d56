"""Batch inference jobs on the fleet's idle capacity: ``autoglm job run`` and :func:`run_job`."""

from jobs.config import JobConfig
from jobs.runner import JobSummary, run_job

__all__ = ["JobConfig", "JobSummary", "run_job"]

"""Where the runbooks live: one base URL for every alert's ``runbook_url`` and dashboard link."""

from __future__ import annotations

RUNBOOK_BASE_URL = "https://github.com/open-autoglm/open-autoglm/blob/main/docs/runbooks.md"


def runbook_url(alertname: str) -> str:
    """The runbook section of an alert: GitHub anchors are the lower-cased heading text."""
    return f"{RUNBOOK_BASE_URL}#{alertname.lower()}"

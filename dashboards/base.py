"""What every project dashboard shares, so the five of them look and behave alike."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DashboardLinkType


def new_dashboard(
    title: str, uid: str, description: str, tags: Sequence[str], time_from: str = "now-6h"
) -> db.Dashboard:
    """An editable dashboard with a shared crosshair, a 30 s refresh and the viewer's timezone."""
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["autoglm", *tags])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time(time_from, "now")
        .timezone("browser")
    )


def link_to(title: str) -> db.DashboardLink:
    """A link to the other autoglm dashboards that carries the variables and the time range."""
    return (
        db.DashboardLink(title)
        .type(DashboardLinkType.DASHBOARDS)
        .tags(["autoglm"])
        .as_dropdown(False)
        .include_vars(True)
        .keep_time(True)
    )

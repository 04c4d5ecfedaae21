"""Alerts panel: the shown node's active alerts (ops.alerts through ops.fleet.watch), each with its
message, evidence and since when. Shown only while there are some; the header counts them and shows
the node's cost. CLI: `nodedeck alerts NODE`."""

from __future__ import annotations

from rich.text import Text

from ops.alerts.records import Severity
from ops.fleet.status import NodeStatus
from ops.textsafe import shown
from tui.format import clock, human_age
from tui.widgets.panel import Fetch, Panel, Reading
from tui.widgets.text import LiveText

MIN_REFRESH_S = 5.0
"""Alerts stand on minutes of evidence: a poll every few seconds is plenty."""


def alerts_text(status: NodeStatus, now: float) -> Text:
    t = Text()
    for i, a in enumerate(status.alerts):
        if i:
            t.append("\n")
        critical = a.severity is Severity.CRITICAL
        t.append("✗ " if critical else "⚠ ", style="bold red" if critical else "bold yellow")
        t.append(shown(a.message), style="bold")
        t.append(f"  {shown(a.evidence)}", style="dim")
        if a.since is not None:
            t.append(f"  since {clock(a.since)} ({human_age(now - a.since)})", style="dim")
    return t


class AlertsPanel(LiveText, Panel[NodeStatus]):
    TITLE = "Alerts"
    MIN_REFRESH_S = MIN_REFRESH_S

    def __init__(self, **kw):
        super().__init__(Text(""), **kw)
        self.status: NodeStatus | None = None
        """The shown node's fleet row as last polled (the header reads its alerts and cost)."""
        self.display = False

    def fetcher(self) -> Fetch[NodeStatus]:
        return lambda source: source.poll_node_status()

    def show(self, status: NodeStatus, now: float) -> Reading | None:
        self.status = status
        self.display = bool(status.alerts)
        self.set_title(f"Alerts · {len(status.alerts)} active" if status.alerts else self.TITLE)
        self.set_text(alerts_text(status, now))
        return None

"""The main screen: header, the six panels, footer. Its keys act on the selected stage."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer

from tui.widgets.events import EventLog
from tui.widgets.gpus import GpuTable
from tui.widgets.header import NodeHeader
from tui.widgets.host import HostPanel
from tui.widgets.inference import InferencePanel
from tui.widgets.plan import PlanList
from tui.widgets.training import TrainingPanel

PANEL_TITLES = {
    "plan": "Todo",
    "events": "Events",
    "gpus-box": "GPUs",
    "training": "Training",
    "inference": "Inference",
    "host": "Host",
}


def build_body() -> Horizontal:
    """The panels, freshly made (a node switch replaces them all)."""
    body = Horizontal(
        Vertical(
            PlanList(id="plan", classes="panel"),
            EventLog(id="events", classes="panel"),
            HostPanel(id="host", classes="panel"),
            id="left",
        ),
        Vertical(
            VerticalScroll(GpuTable(id="gpus"), id="gpus-box", classes="panel"),
            Horizontal(
                TrainingPanel(id="training", classes="panel"),
                InferencePanel(id="inference", classes="panel"),
                id="charts",
            ),
            id="right",
        ),
        id="body",
    )
    return body


class DashboardScreen(Screen[None]):
    BINDINGS = [
        Binding("s", "app.launch(True)", "Smoke"),
        Binding("l", "app.launch(False)", "Launch"),
        Binding("enter", "app.launch(False)", "Launch", show=False),
        Binding("x", "app.stop", "Stop"),
        Binding("r", "app.restart", "Restart"),
        Binding("v", "app.verify", "Verify"),
        Binding("k", "app.skip", "Skip"),
        Binding("o", "app.open_log", "Log"),
        Binding("n,ctrl+n", "app.switch_node", "Node"),
        Binding("D", "app.decommission", "Decom"),
        Binding("m", "app.cycle_metric", "Metric", show=False),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit"),
    ]

    def compose(self) -> ComposeResult:
        yield NodeHeader(id="header")
        yield build_body()
        yield Footer()

    def on_mount(self) -> None:
        self.titles()

    def titles(self) -> None:
        for wid, title in PANEL_TITLES.items():
            self.query_one(f"#{wid}").border_title = title
        self.query_one(PlanList).focus()

    async def rebuild(self) -> None:
        """Replace every panel with an empty one (after a node switch)."""
        await self.query_one("#body").remove()
        await self.mount(build_body(), after=self.query_one(NodeHeader))
        self.titles()

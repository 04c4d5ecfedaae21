"""The main screen: header, the panels, footer. Its keys act on the selected stage.

`PANELS` registers every panel once: which widget shows it (the widget says what
it polls and how it draws it, see tui.widgets.panel) and whether its polls read
the node (their failures or hangs make the header say stale). Adding a panel is
one entry here, one widget module and its place in `build_body`.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from tui.keys import Key, bindings
from tui.widgets.events import EventLog
from tui.widgets.gpus import GpuPanel
from tui.widgets.header import NodeHeader
from tui.widgets.host import HostPanel
from tui.widgets.inference import InferencePanel
from tui.widgets.panel import Panel
from tui.widgets.plan import PlanList
from tui.widgets.training import TrainingPanel


@dataclass(frozen=True)
class PanelSpec:
    panel: type[Panel]
    id: str
    reads_node: bool
    """Its polls only read the node: failures or hangs make the header say stale. (A plan tick
    may wait behind a launch or a stop, which is no sign of a dead node.)"""


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(PlanList, "plan", reads_node=False),
    PanelSpec(EventLog, "events", reads_node=False),
    PanelSpec(GpuPanel, "gpus-box", reads_node=True),
    PanelSpec(HostPanel, "host", reads_node=True),
    PanelSpec(InferencePanel, "inference", reads_node=False),
    PanelSpec(TrainingPanel, "training", reads_node=False),
)

KEYS: tuple[Key, ...] = (
    Key("s", "launch(True)", "Smoke", "Launch smoke run", "Start the selected stage's small smoke variant"),
    Key("l", "launch(False)", "Launch", "Launch full run",
        "Start the selected stage (refused until its smoke run verified)", hidden="enter"),
    Key("x", "stop", "Stop", "Stop stage", "Stop the selected stage's process after confirming its PID and command"),
    Key("r", "restart", "Restart", "Restart stage",
        "Stop (confirming its PID when it runs) and start the selected stage again"),
    Key("v", "verify", "Verify", "Verify now", "Run the selected stage's verify checks now"),
    Key("k", "skip", "Skip", "Skip stage", "Mark the selected stage skipped (dependents may start)"),
    Key("o", "open_log", "Log", "Open log", "The selected stage's live log, full screen (/ searches, n next)"),
    Key("n,ctrl+n", "switch_node", "Node", "Switch node", "Pick another node from nodes.toml"),
    Key("D", "decommission", "Decom", "Decommission wizard",
        "Check that everything is preserved before the node is shut down"),
    Key("m", "cycle_metric", "", "Next training metric", "Cycle the metric drawn beside the loss"),
    Key("up,down", "", "", "", "Select a stage"),
    Key("question_mark", "help", "Help", "Help", "Every key and what it does"),
    Key("ctrl+p", "", "", "", "Command palette: every action by name"),
    Key("q", "quit", "Quit", "", "Leave the dashboard; stages keep running in tmux"),
)


def build_body() -> Horizontal:
    """The panels, freshly made (a node switch replaces them all)."""
    ids = {spec.panel: spec.id for spec in PANELS}

    def make(panel: type[Panel]) -> Panel:
        return panel(id=ids[panel])

    return Horizontal(
        Vertical(make(PlanList), make(EventLog), make(HostPanel), id="left"),
        Vertical(
            make(GpuPanel),
            Horizontal(make(TrainingPanel), make(InferencePanel), id="charts"),
            id="right",
        ),
        id="body",
    )


class DashboardScreen(Screen[None]):
    BINDINGS = bindings(KEYS, prefix="app.")

    def compose(self) -> ComposeResult:
        yield NodeHeader(id="header")
        yield build_body()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PlanList).focus()

    @property
    def header(self) -> NodeHeader:
        return self.query_one(NodeHeader)

    @property
    def plan(self) -> PlanList:
        return self.query_one(PlanList)

    @property
    def events(self) -> EventLog:
        return self.query_one(EventLog)

    @property
    def training(self) -> TrainingPanel:
        return self.query_one(TrainingPanel)

    def panels(self) -> list[tuple[PanelSpec, Panel]]:
        """Every registered panel with its widget (none while a node switch rebuilds them)."""
        found = []
        for spec in PANELS:
            widgets = self.query(f"#{spec.id}")
            if widgets:
                found.append((spec, widgets.first(Panel)))
        return found

    async def rebuild(self) -> None:
        """Replace every panel with an empty one (after a node switch)."""
        await self.query_one("#body").remove()
        await self.mount(build_body(), after=self.header)
        self.query_one(PlanList).focus()

"""The main screen: header, the panels, footer. Its keys act on the selected stage.

`PANELS` registers every panel once: which widget shows it (the widget says what
it reads and how it draws it, and holds its own CSS, see tui.widgets.panel), where
it goes, and whether its reads read the node (their failures or hangs make the
header say stale). Adding a panel is one widget module and one entry here: the
refresh loop (tui.refresh) reads every registered panel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence, TypeVar

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from tui.keys import Key, bindings
from tui.widgets.alerts import AlertsPanel
from tui.widgets.events import EventLog
from tui.widgets.gpus import GpuPanel
from tui.widgets.header import NodeHeader
from tui.widgets.host import HostPanel
from tui.widgets.inference import InferencePanel
from tui.widgets.outcome import OutcomePanel
from tui.widgets.panel import Panel
from tui.widgets.plan import PlanList
from tui.widgets.training import TrainingPanel

P = TypeVar("P", bound=Panel[Any])
Area = Literal["left", "right", "charts"]
"""Where a panel goes: the left column, the right one, or the row of charts at the bottom of the right one."""


@dataclass(frozen=True)
class PanelSpec:
    panel: type[Panel[Any]]
    id: str
    reads_node: bool
    """Its reads only read the node: failures or hangs make the header say stale. (A plan tick
    may wait behind a launch or a stop, which is no sign of a dead node.)"""
    area: Area
    """Where it goes; panels of one area are stacked in the order listed."""


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(AlertsPanel, "alerts", reads_node=False, area="left"),
    PanelSpec(PlanList, "plan", reads_node=False, area="left"),
    PanelSpec(EventLog, "events", reads_node=False, area="left"),
    PanelSpec(HostPanel, "host", reads_node=True, area="left"),
    PanelSpec(GpuPanel, "gpus-box", reads_node=True, area="right"),
    PanelSpec(OutcomePanel, "outcome", reads_node=False, area="right"),
    PanelSpec(TrainingPanel, "training", reads_node=False, area="charts"),
    PanelSpec(InferencePanel, "inference", reads_node=False, area="charts"),
)

KEYS: tuple[Key, ...] = (
    Key("s", "launch(True)", "Smoke", "Launch smoke run", "Start the selected stage's small smoke variant"),
    Key("l", "launch(False)", "Launch", "Launch full run",
        "Start the selected stage (refused until its smoke run verified; a completed one after confirming)",
        hidden="enter"),
    Key("x", "stop", "Stop", "Stop stage", "Stop the selected stage's process after confirming its PID and command"),
    Key("r", "restart", "Restart", "Restart stage",
        "Stop (confirming its PID when it runs) and start the selected stage again"),
    Key("v", "verify", "Verify", "Verify now", "Run the selected stage's verify checks now"),
    Key("k", "skip", "Skip", "Skip stage",
        "Mark the selected stage skipped (dependents may start); a completed one after confirming"),
    Key("u", "unskip", "", "Undo skip", "Undo the selected stage's skip: its own run's verdict shows again"),
    Key("o", "open_log", "Log", "Open log", "The selected stage's live log, full screen (/ searches, n next)"),
    Key("a", "attach", "Attach", "Attach to stage",
        "Suspend the dashboard and attach this terminal to the selected stage's tmux session; "
        "detach (C-b d) to return"),
    Key("n,ctrl+n", "switch_node", "Node", "Switch node", "Pick another node from nodes.toml"),
    Key("F", "fleet", "Fleet", "Fleet", "Every node at once: reachable, GPUs, stages, progress, disk, alerts, cost"),
    Key("D", "decommission", "Decom", "Decommission wizard",
        "Check that everything is preserved before the node is shut down"),
    Key("m", "cycle_metric", "", "Next training metric", "Cycle the metric drawn beside the loss"),
    Key("e", "cycle_smoothing", "", "Chart smoothing", "Charts' EMA smoothing: off, 0.6, 0.9, 0.99"),
    Key("y", "toggle_log", "", "Log scale", "Charts' y axis: linear or log"),
    Key("w", "cycle_window", "", "tok/s window", "The tok/s chart's time window: last 5m, 30m, all kept"),
    Key("up,down", "", "", "", "Select a stage"),
    Key("question_mark", "help", "Help", "Help", "Every key and what it does"),
    Key("ctrl+p", "", "", "", "Command palette: every action by name"),
    Key("q", "quit", "Quit", "", "Leave the dashboard; stages keep running in tmux"),
)


def build_body(specs: Sequence[PanelSpec]) -> tuple[Horizontal, list[tuple[PanelSpec, Panel[Any]]]]:
    """The panels, freshly made (a node switch replaces them all), in their layout, and each with its spec."""
    made: list[tuple[PanelSpec, Panel[Any]]] = [(spec, spec.panel(id=spec.id)) for spec in specs]

    def placed(area: Area) -> list[Panel[Any]]:
        return [panel for spec, panel in made if spec.area == area]

    body = Horizontal(
        Vertical(*placed("left"), id="left"),
        Vertical(*placed("right"), Horizontal(*placed("charts"), id="charts"), id="right"),
        id="body",
    )
    return body, made


class DashboardScreen(Screen[None]):
    BINDINGS = bindings(KEYS, prefix="app.")

    def __init__(self, specs: Sequence[PanelSpec] = PANELS) -> None:
        super().__init__()
        self.specs = tuple(specs)
        """The registered panels shown (PANELS; a test adds its own)."""
        self._panels: list[tuple[PanelSpec, Panel[Any]]] = []

    def compose(self) -> ComposeResult:
        body, self._panels = build_body(self.specs)
        yield NodeHeader(id="header")
        yield body
        yield Footer()

    def on_mount(self) -> None:
        self.plan.focus()

    @property
    def header(self) -> NodeHeader:
        return self.query_one(NodeHeader)

    def _panel(self, panel_type: type[P]) -> P:
        return next(p for _, p in self._panels if isinstance(p, panel_type))

    @property
    def plan(self) -> PlanList:
        return self._panel(PlanList)

    @property
    def events(self) -> EventLog:
        return self._panel(EventLog)

    @property
    def alerts(self) -> AlertsPanel | None:
        """None while a node switch rebuilds the panels."""
        return next((p for _, p in self._panels if isinstance(p, AlertsPanel)), None)

    @property
    def training(self) -> TrainingPanel:
        return self._panel(TrainingPanel)

    def panels(self) -> list[tuple[PanelSpec, Panel[Any]]]:
        """Every registered panel with its widget (none while a node switch rebuilds them)."""
        return self._panels

    async def rebuild(self) -> None:
        """Replace every panel with an empty one (after a node switch)."""
        self._panels = []
        await self.query_one("#body").remove()
        body, panels = build_body(self.specs)
        await self.mount(body, after=self.header)
        self._panels = panels
        self.plan.focus()

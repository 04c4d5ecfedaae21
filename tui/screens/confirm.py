"""Confirmations. Before a stop or restart: names the node, session, PID and command that will get the signal
(and each other node-rank of a stage on several nodes). Before a key redoes or hides a completed stage (a stray
Enter on a finished training): names the stage, its verified run and what would be lost."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from ops.plan.records import StageKind
from ops.run.views import StageState, StageView
from ops.textsafe import shown
from tui.format import clock
from tui.source import StopTarget


class ConfirmStopScreen(ModalScreen[bool]):
    """Dismisses True to stop, False to leave the process running."""

    AUTO_FOCUS = "#confirm-no"

    BINDINGS = [
        Binding("y", "answer(True)", "Stop it"),
        Binding("escape,n", "answer(False)", "Cancel"),
    ]

    def __init__(self, target: StopTarget, *, then_start: bool = False):
        super().__init__()
        self.target = target
        self.then_start = then_start
        """A restart: the stage is started again once the process ended."""

    def compose(self) -> ComposeResult:
        target = self.target
        msg = Text()
        msg.append("Restart stage " if self.then_start else "Stop stage ")
        msg.append(shown(target.stage), style="bold")
        msg.append(f" on {shown(target.node_name)}?\n\n")
        msg.append("SIGTERM (then SIGKILL after the grace period) goes to PID ")
        msg.append(str(target.pid), style="bold red")
        msg.append(f" and its process group, tmux session {shown(target.tmux_name)}")
        if target.started_at:
            msg.append(f", started {clock(target.started_at)}")
        msg.append(":\n\n")
        msg.append(shown(target.command, lines=True), style="bold")
        if target.other_ranks:
            msg.append("\n\nand, each by its own recorded PID, the stage's other nodes: ")
            msg.append(shown("; ".join(target.other_ranks)), style="bold red")
        if self.then_start:
            msg.append("\n\nOnce it ended, the stage is started again.")
        with Vertical(id="confirm-box"):
            yield Static(msg, id="confirm-text")
            with Horizontal(id="confirm-buttons"):
                verb = "Restart" if self.then_start else "Stop"
                yield Button(f"{verb}: signal PID {target.pid} (y)", variant="error", id="confirm-yes")
                yield Button("Cancel (esc)", variant="primary", id="confirm-no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


@dataclass(frozen=True)
class FinishedWork:
    """A key that would redo or hide a stage's finished, verified run: what the confirmation names."""

    verb: str
    """`Run again`, `Smoke run`, `Skip`: the button's label."""
    stage: StageView
    consequence: str
    """What happens to the finished run (`a new run replaces it as the stage's result`)."""


def server_up(stage: StageView) -> bool:
    """A server stage that is completed while its process runs (its checks pass while it is up)."""
    return stage.kind is StageKind.SERVER and stage.state is StageState.COMPLETED and stage.ended_at is None


def finished_work(stage: StageView, action: str, unskip: str) -> FinishedWork | None:
    """What `action` (launch, smoke, restart, skip) would throw away on this stage (`unskip`: the command that
    undoes a skip, with its context); None when nothing finished or still running (a server that is up is
    `completed`: ops refuses to launch or skip it, and a restart asks through ConfirmStopScreen, naming its PID)."""
    if stage.state is not StageState.COMPLETED or server_up(stage):
        return None
    if action == "skip":
        return FinishedWork("Skip", stage, "its verified result is hidden: the stage shows skipped "
                            f"(u, or `{unskip}`, undoes it)")
    if action == "smoke":
        return FinishedWork("Smoke run", stage, "a smoke run becomes its latest run: its verified result "
                            "is replaced by the smoke run's")
    return FinishedWork("Run again", stage, "a new run starts and replaces it as the stage's result "
                        "(its outputs may be overwritten)")


class ConfirmFinishedScreen(ModalScreen[bool]):
    """Before a key redoes or hides a completed stage: names the stage, its verified run and what is lost.
    Dismisses True to go on; Cancel (the focused button, so a stray Enter) leaves it as it is."""

    AUTO_FOCUS = "#confirm-no"

    BINDINGS = [
        Binding("y", "answer(True)", "Go on"),
        Binding("escape,n", "answer(False)", "Cancel"),
    ]

    def __init__(self, work: FinishedWork):
        super().__init__()
        self.work = work

    def compose(self) -> ComposeResult:
        work, stage = self.work, self.work.stage
        msg = Text()
        msg.append(f"{work.verb}: stage ")
        msg.append(shown(stage.id), style="bold")
        msg.append(f" on {shown(stage.node_name)}?\n\n")
        msg.append("It is completed", style="bold green")
        if stage.ended_at:
            msg.append(f" (ended {clock(stage.ended_at)})")
        if stage.detail:
            msg.append(f": {shown(stage.detail)}")
        msg.append(".\n\n")
        msg.append(f"{work.verb} and {work.consequence}.")
        with Vertical(id="confirm-box"):
            yield Static(msg, id="confirm-text")
            with Horizontal(id="confirm-buttons"):
                yield Button(Text(f"{work.verb} {shown(stage.id)} (y)"), variant="error", id="confirm-yes")
                yield Button("Cancel (esc)", variant="primary", id="confirm-no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

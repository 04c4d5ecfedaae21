"""Confirmation before a stop or restart: names the node, session, PID and command that will get the signal
(and each other node-rank of a stage on several nodes)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

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
        msg.append(f" and its process group, tmux session {shown(target.tmux_session)}")
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

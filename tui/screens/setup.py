"""`nodedeck node setup NODE` from the dashboard: `u` in the node picker opens this, one line per step."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ops import hints
from ops.errors import NodedeckError
from ops.setup.probe import printable
from ops.setup.steps import SetupResult, StepResult, StepStatus

_STYLE = {StepStatus.OK: "green", StepStatus.SKIPPED: "dim", StepStatus.WARNING: "yellow", StepStatus.FAILED: "red"}


class SetupStep(Message):
    """A step of the setup ended (sent from the worker thread)."""

    def __init__(self, result: StepResult):
        super().__init__()
        self.result = result


class SetupEnded(Message):
    """The setup is over: its result, or the one line that stopped it before any step."""

    def __init__(self, result: SetupResult | None, error: str | None):
        super().__init__()
        self.result, self.error = result, error


class NodeSetupScreen(ModalScreen[None]):
    """Runs the node's setup in a thread worker and shows each step as it ends; esc closes it."""

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, node: str, config_path: str | Path | None = None):
        super().__init__()
        self.node_name, self.config_path = node, config_path
        self.lines = Text()

    def compose(self) -> ComposeResult:
        with Vertical(id="setup-box"):
            command = hints.current().command("node", "setup", self.node_name)
            yield Label(Text(f"Setting up {self.node_name}: {command} (esc closes)"), id="setup-title")
            yield Static(self.lines, id="setup-steps")

    def on_mount(self) -> None:
        self.run_worker(self._run, thread=True, name=f"setup {self.node_name}")

    def _run(self) -> None:
        from ops.node_handle import NodeHandle
        from ops.setup.steps import setup_node

        try:
            with NodeHandle.open(self.node_name, self.config_path) as handle:
                result = setup_node(handle, on_step=self._stepped)
        except NodedeckError as e:
            self.post_message(SetupEnded(None, printable(str(e), 500)))
            return
        self.post_message(SetupEnded(result, None))

    def _stepped(self, step: StepResult) -> None:
        self.post_message(SetupStep(step))

    def _add(self, text: str, style: str = "") -> None:
        if self.lines.plain:
            self.lines.append("\n")
        self.lines.append(text, style=style)   # plain text: node words never become markup
        self.query_one("#setup-steps", Static).update(self.lines)

    def on_setup_step(self, message: SetupStep) -> None:
        r = message.result
        self._add(f"{r.status.value:<8} {r.step:<12} {r.detail}  ({r.seconds:.1f}s)", _STYLE[r.status])

    def on_setup_ended(self, message: SetupEnded) -> None:
        if message.error is not None:
            self._add(message.error, "red")
        elif message.result is not None and message.result.ok and message.result.setup is not None:
            version = message.result.setup.version
            self._add(f"{self.node_name} is ready: plans run nodedeck-train {version}", "bold green")
        else:
            self._add(f"{self.node_name} is not ready: fix the failed step and set it up again (what is done is kept)",
                      "bold red")

    def action_close(self) -> None:
        self.dismiss(None)

"""`nodedeck node setup NODE` from the dashboard: `u` in the node picker opens this, one line per step.

The setup runs in an app-level thread worker, not the screen's: closing the screen never hides a setup that goes
on. `esc` while it runs asks whether to stop it (what it started on the node is stopped by its process group)
or leave it running in the background; `u` on that node again shows the same setup (one setup of a node at a
time in a dashboard; across dashboards and terminals the node's lock sees to it, ops.setup.lock).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from ops import hints
from ops.errors import NodedeckError
from ops.node_handle import NodeHandle
from ops.setup.steps import SetupResult, SetupRun, StepResult, StepStatus
from ops.textsafe import printable

_STYLE = {StepStatus.OK: "green", StepStatus.SKIPPED: "dim", StepStatus.WARNING: "yellow", StepStatus.FAILED: "red"}


class DashboardSetup:
    """One setup this dashboard runs: the SetupRun, how it ended, and who is told when it does."""

    def __init__(self, node: str, config_path: str | Path | None):
        self.node, self.config_path = node, config_path
        self.run = SetupRun(face="the dashboard")
        self.result: SetupResult | None = None
        self.error: str | None = None
        self.ended = threading.Event()
        self._guard = threading.Lock()
        self._on_end: list[Callable[[], None]] = []

    def work(self) -> None:
        """The setup, start to end (a thread worker's body)."""
        try:
            with NodeHandle.open(self.node, self.config_path) as handle:
                self.result = self.run.run(handle)
        except NodedeckError as e:
            self.error = printable(str(e), 500)
        finally:
            with self._guard:
                self.ended.set()
                listeners = list(self._on_end)
            for fn in listeners:
                fn()

    def watch(self, on_step: Callable[[StepResult], None], on_end: Callable[[], None]) -> tuple[StepResult, ...]:
        """Tell on_step of each step from now on and on_end when it ends (at once when it has); the steps so far."""
        with self._guard:
            so_far = self.run.watch(on_step)
            ended = self.ended.is_set()
            if not ended:
                self._on_end.append(on_end)
        if ended:
            on_end()
        return so_far

    def unwatch(self, on_step: Callable[[StepResult], None], on_end: Callable[[], None]) -> None:
        self.run.unwatch(on_step)
        with self._guard:
            if on_end in self._on_end:
                self._on_end.remove(on_end)


RUNNING: dict[tuple[str, str], DashboardSetup] = {}
"""The setups this dashboard started, by (nodes.toml, node): `u` on a node whose setup still runs shows it."""


class SetupStep(Message):
    """A step of the setup ended (sent from the worker thread)."""

    def __init__(self, result: StepResult):
        super().__init__()
        self.result = result


class SetupEnded(Message):
    """The setup is over (its result or error is on the DashboardSetup)."""


class StopSetupScreen(ModalScreen[str | None]):
    """Asked on `esc` while a setup runs: "stop" it, leave it running in the "background", or None (stay)."""

    AUTO_FOCUS = "#stop-stay"
    DEFAULT_CSS = """
    StopSetupScreen { align: center middle; }
    #stop-box { width: 76; height: auto; border: thick $error 70%; background: $surface; padding: 1 2; }
    #stop-buttons { height: auto; margin: 1 0 0 0; }
    #stop-buttons Button { margin: 0 2 0 0; }
    """
    BINDINGS = [Binding("y", "answer('stop')", "Stop it"), Binding("n", "answer('background')", "Leave it running"),
                Binding("escape", "answer(None)", "Stay")]

    def __init__(self, node: str, now: str):
        super().__init__()
        self.node, self.now = node, now

    def compose(self) -> ComposeResult:
        with Vertical(id="stop-box"):
            yield Static(Text(f"The setup of {self.node} is still running ({self.now}).\n\nStop it? y stops it and "
                              "what it started on the node (by its process group); n leaves it running in the "
                              "background (u in the node picker shows it again); esc stays here."), id="stop-text")
            with Horizontal(id="stop-buttons"):
                yield Button("Stop it (y)", variant="error", id="stop-yes")
                yield Button("Leave it running (n)", id="stop-no")
                yield Button("Stay (esc)", variant="primary", id="stop-stay")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss({"stop-yes": "stop", "stop-no": "background"}.get(event.button.id or ""))

    def action_answer(self, answer: str | None) -> None:
        self.dismiss(answer)


class NodeSetupScreen(ModalScreen[None]):
    """Shows the node's setup (started here, or the one this dashboard already runs), each step as it ends."""

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, node: str, config_path: str | Path | None = None):
        super().__init__()
        self.node_name, self.config_path = node, config_path
        self.lines = Text()
        self.setup: DashboardSetup | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="setup-box"):
            command = hints.current().command("node", "setup", self.node_name)
            yield Label(Text(f"Setting up {self.node_name}: {command} (esc closes, or asks while it runs)"),
                        id="setup-title")
            yield Static(self.lines, id="setup-steps")

    def on_mount(self) -> None:
        key = (str(self.config_path or ""), self.node_name)
        running = RUNNING.get(key)
        if running is not None and not running.ended.is_set():
            started = time.strftime("%H:%M:%S", time.localtime(running.run.started_at))
            self._add(f"the setup of {self.node_name} this dashboard started at {started} is still running: shown "
                      "here, no second one started", "bold")
            self.setup = running
        else:
            self.setup = RUNNING[key] = DashboardSetup(self.node_name, self.config_path)
            self.app.run_worker(self.setup.work, thread=True, name=f"setup {self.node_name}", group="node-setup",
                                exit_on_error=False)
        for step in self.setup.watch(self._stepped, self._ended):
            self._show(step)

    def on_unmount(self) -> None:
        if self.setup is not None:
            self.setup.unwatch(self._stepped, self._ended)

    def _stepped(self, step: StepResult) -> None:
        self.post_message(SetupStep(step))

    def _ended(self) -> None:
        self.post_message(SetupEnded())

    def _add(self, text: str, style: str = "") -> None:
        if self.lines.plain:
            self.lines.append("\n")
        self.lines.append(text, style=style)   # plain text: node words never become markup
        if self.is_mounted:
            self.query_one("#setup-steps", Static).update(self.lines)

    def _show(self, r: StepResult) -> None:
        self._add(f"{r.status.value:<8} {r.step:<12} {r.detail}  ({r.seconds:.1f}s)", _STYLE[r.status])

    def on_setup_step(self, message: SetupStep) -> None:
        self._show(message.result)

    def on_setup_ended(self, message: SetupEnded) -> None:
        setup = self.setup
        if setup is None:
            return
        if setup.error is not None:
            self._add(setup.error, "red")
        elif setup.result is not None and setup.result.ok and setup.result.setup is not None:
            self._add(f"{self.node_name} is ready: plans run nodedeck-train {setup.result.setup.version}", "bold green")
        else:
            self._add(f"{self.node_name} is not ready: fix the failed step and set it up again (what is done is kept)",
                      "bold red")

    def action_close(self) -> None:
        setup = self.setup
        if setup is None or setup.ended.is_set():
            self.dismiss(None)
            return
        steps = setup.run.steps
        now = f"last step: {steps[-1].step}" if steps else "starting"

        def answered(answer: str | None) -> None:
            if answer == "background":
                self.dismiss(None)
            elif answer == "stop" and not setup.run.stopping.is_set():
                self._add("stopping the setup and what it started on the node ...", "bold")
                self.app.run_worker(setup.run.stop, thread=True, name=f"stop setup {self.node_name}",
                                    group="node-setup-stop", exit_on_error=False)

        self.app.push_screen(StopSetupScreen(self.node_name, now), answered)

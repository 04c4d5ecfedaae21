"""The `?` screen: every key and what it does."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, keys: list[tuple[str, str]]):
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        table = Table(title="nodedeck keys", expand=True, show_edge=False)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("action")
        for key, what in self.keys:
            table.add_row(key, what)
        with VerticalScroll(id="help-box"):
            yield Static(table)
            yield Static(
                "Every action is also in the command palette (ctrl+p) and is a `nodedeck` CLI command. "
                "Quitting leaves every stage running in tmux on its node.",
                id="help-note",
            )

    def action_close(self) -> None:
        self.dismiss(None)

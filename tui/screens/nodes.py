"""Node picker over the nodes in nodes.toml."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from ops.textsafe import shown
from tui.screens.setup import NodeSetupScreen


class NodePickerScreen(ModalScreen[str | None]):
    """Dismisses with the chosen node's name, or None; `u` sets the highlighted node up (NodeSetupScreen)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("u", "setup", "Set up node")]

    def __init__(self, nodes: list[str], current: str):
        super().__init__()
        self.nodes = nodes
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box"):
            yield Label("Switch node (enter picks, u sets it up to run plans, esc cancels)", id="picker-title")
            yield OptionList(
                *[Option(Text(shown(f"{n}  (current)" if n == self.current else n)), id=n) for n in self.nodes],
                id="picker-list",
            )

    AUTO_FOCUS = "#picker-list"

    def on_mount(self) -> None:
        for lst in self.query(OptionList):  # none when dismissed before it mounted
            if self.current in self.nodes:
                lst.highlighted = self.nodes.index(self.current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_setup(self) -> None:
        lst = self.query_one(OptionList)
        if lst.highlighted is not None:
            config = getattr(getattr(self.app, "source", None), "config_path", None)
            self.app.push_screen(NodeSetupScreen(self.nodes[lst.highlighted], config))

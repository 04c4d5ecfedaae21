"""FleetTable: the fleet screen's rows, one line per node, drawn with the line API (tui.widgets.lines).

A DataTable renders every visible cell again whenever any one cell changes (its caches are keyed by
an update count), so a fleet where one disk estimate moves each second paid for the whole table each
second. Here a row is one line of text: cells padded to their column's widest, the highlighted row
reversed, every other row striped; a repaint draws only the lines whose text changed (and all of them
only when a column's width changes). Up/down, Page Up/Down and Home/End move the highlight; Enter or a
click picks the row.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import ScrollableContainer
from textual.geometry import Region, Size
from textual.message import Message
from textual.widget import Widget

from tui.widgets.lines import TextLines

GAP = 2
"""Columns between cells."""


class FleetTable(TextLines, can_focus=True):
    """A header line and one line per row: `show(rows)` with (key, cells) in order; the keys stay put."""

    DEFAULT_CSS = """
    FleetTable {
        width: auto;       /* every column at its widest: in a ScrollableContainer a narrow screen scrolls sideways */
        min-width: 100%;
    }
    """

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,ctrl+home", "cursor(-1000000)", "First", show=False),
        Binding("end,ctrl+end", "cursor(1000000)", "Last", show=False),
        Binding("enter", "pick", "Open", show=False),
    ]

    class Picked(Message):
        """A row was picked (Enter, or a click on it)."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, columns: Sequence[str], **kw):
        super().__init__(**kw)
        self.columns = tuple(columns)
        self.keys: list[str] = []
        """The rows' keys, top to bottom."""
        self._cells: dict[str, tuple[Text, ...]] = {}
        self.cursor = 0
        """The highlighted row's index."""

    @property
    def row_count(self) -> int:
        return len(self.keys)

    def get_row(self, key: str) -> tuple[Text, ...]:
        """The cells of row `key` as last shown (KeyError if there is none)."""
        return self._cells[key]

    def show(self, rows: Sequence[tuple[str, tuple[Text, ...]]]) -> None:
        """Show these rows (in this order); only the lines that changed are drawn again."""
        keys = [k for k, _ in rows]
        cells = dict(rows)
        if keys == self.keys and cells == self._cells:
            return
        self.keys, self._cells = keys, cells
        self.cursor = min(self.cursor, max(0, len(keys) - 1))
        room = self.parent.scrollable_content_region.width if isinstance(self.parent, Widget) else 0
        if self.size.width and max(room, self._natural_width()) != self.size.width:
            self.refresh(layout=True)   # wider than the screen, or back within it: the table's width changes
        self.changed()

    def _widths(self) -> list[int]:
        widths = [len(c) for c in self.columns]
        for cells in self._cells.values():
            for i, cell in enumerate(cells):
                widths[i] = max(widths[i], cell.cell_len)
        return widths

    def _natural_width(self) -> int:
        """Every column at its widest, with the gaps between them."""
        return sum(w + GAP for w in self._widths())

    def get_content_width(self, container: Size, viewport: Size) -> int:
        """CSS `width: auto`: the natural width, so a narrower screen scrolls the table sideways."""
        return self._natural_width()

    def texts(self, width: int) -> list[Text]:
        widths = self._widths()
        header = Text(no_wrap=True, overflow="ellipsis", style="bold")
        for i, name in enumerate(self.columns):
            header.append(name.ljust(widths[i] + GAP))
        header.append(" " * (width - header.cell_len))   # as wide as the rows: a column growing changes no text
        lines = [header]
        for n, key in enumerate(self.keys):
            style = "reverse" if n == self.cursor else "on grey11" if n % 2 else ""
            line = Text(no_wrap=True, overflow="ellipsis", style=style)
            for i, cell in enumerate(self._cells[key]):
                line.append_text(cell)
                line.append(" " * (widths[i] - cell.cell_len + GAP))
            line.append(" " * (width - line.cell_len))      # the stripe and the highlight span the line
            lines.append(line)
        return lines

    def action_cursor(self, step: int) -> None:
        if not self.keys:
            return
        self.cursor = max(0, min(len(self.keys) - 1, self.cursor + step))
        self.changed()
        parent = self.parent
        if isinstance(parent, ScrollableContainer):  # keep the highlighted line (and the header above it) in view
            parent.scroll_to_region(Region(0, self.cursor, 1, 2), animate=False, x_axis=False)

    def action_page(self, pages: int) -> None:
        """The highlight a screenful up or down (the view follows it: Enter opens a row in view)."""
        parent = self.parent
        height = parent.size.height if isinstance(parent, Widget) else self.size.height
        self.action_cursor(pages * max(1, height - 2))

    def action_pick(self) -> None:
        if self.keys:
            self.post_message(self.Picked(self.keys[self.cursor]))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or not 1 <= offset.y <= len(self.keys):
            return
        self.cursor = offset.y - 1
        self.changed()
        self.action_pick()

"""A Static for text that changes often: repaints only on change, re-lays out only when its shape changed."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tui.format import LastShape, text_shape


class LiveText(Static):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._markup: str | None = None
        self._shape = LastShape()
        self.text: Text | None = None
        """What it shows, as last set."""

    def set_text(self, text: Text) -> None:
        markup = text.markup
        if markup == self._markup:
            return
        self.text = text
        self.update(self.renderable_for(text), layout=self._shape.changed(text_shape(text.plain)))
        self._markup = markup

    def renderable_for(self, text: Text):
        """What is drawn for text (subclasses may lay it out, e.g. with a hanging indent)."""
        return text


def hanging(text: Text, indent: int = 2) -> Table:
    """text with every wrapped line of a row aligned after its first `indent` columns."""
    grid = Table.grid(expand=True)
    grid.add_column(width=indent, no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for line in text.split("\n"):
        grid.add_row(line[:indent], line[indent:])
    return grid

"""A Static for text that changes often: repaints only on change, re-lays out only when its shape changed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.format import text_shape


class LiveText(Static):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._markup: str | None = None
        self._shape: tuple | None = None

    def set_text(self, text: Text) -> None:
        markup = text.markup
        if markup == self._markup:
            return
        shape = text_shape(text.plain)
        self.update(text, layout=shape != self._shape)
        self._markup, self._shape = markup, shape

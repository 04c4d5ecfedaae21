"""Text that changes often: repaints only when it changed, re-lays out only when its number of rows changed."""

from __future__ import annotations

from rich.text import Text

from tui.widgets.lines import TextLines


class LiveText(TextLines):
    def __init__(self, text: Text | None = None, **kw):
        super().__init__(**kw)
        self.text: Text | None = text
        """What it shows, as last set."""

    def set_text(self, text: Text) -> None:
        self.text = text
        self.changed()

    def texts(self, width: int) -> list[Text]:
        return [] if self.text is None else [self.text]

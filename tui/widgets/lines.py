"""Text drawn with Textual's line API: one strip per row, made again only when its row changed.

Rich's renderables go through Textual's visual path, which builds several strips
per row on every repaint (a Table, as a hanging indent needs, many more): a panel
that changes every second pays that for every row. Here each row's strip is kept
and reused while the row's text, the width and the base style are the same, so a
repaint re-renders only the rows that changed (Textual's own per-line styling
then applies the widget's styles to the rows it asks for). Texts wrap as Rich
wraps them, unless no_wrap (then they end with their overflow, e.g. an ellipsis).
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.dom import NoScreen
from textual.errors import NoWidget
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget


def text_key(t: Text) -> tuple:
    """What decides how a text looks: its characters, its spans and its base style."""
    return t.plain, tuple(t.spans), t.style


class TextLines(Widget):
    """Subclasses say what to show at a width (`texts`) and call `changed()` when that may have changed."""

    DEFAULT_CSS = """
    TextLines {
        height: auto;
    }
    """

    HANG: ClassVar[int] = 0
    """Each line's wrapped rows start this many columns in (a hanging indent under its first columns)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._texts: list[Text] = []
        self._keys: list[tuple] | None = None
        """text_key of each text, to tell a change from a repeat."""
        self._texts_for: int | None = None
        """Width the texts were made for; None: ask again."""
        self._rows: list[Text] = []
        self._rows_for: int | None = None
        """Width the rows were wrapped for; None: wrap again."""
        self._layouts = 0
        """Counts wraps of the rows (the strips say which one they show)."""
        self._strips: list[Strip] = []
        self._strips_for: tuple | None = None
        self._cache: dict[tuple, Strip] = {}
        """Row key -> its strip, as last drawn."""
        self._unseen = False
        """Changed while out of view (nothing was repainted): repaint when next drawn."""
        self._base: Style | None = None
        """The widget's style in the current render pass (None until a line is asked for)."""

    def texts(self, width: int) -> list[Text]:
        """What to show at this width."""
        raise NotImplementedError

    def changed(self) -> None:
        """What `texts` returns may have changed: repaint the rows that did, lay out again only when the
        number of rows changed (a clock ticking in a line repaints that one row, nothing more).

        A widget out of view (a row scrolled away) is not refreshed: refreshing it would make Textual
        rebuild its map of every widget on the next update. It repaints when it is next drawn."""
        width = self.size.width
        texts = self.texts(width)
        keys = [text_key(t) for t in texts]
        if keys == self._keys and width == self._texts_for:
            return
        before = [text_key(r) for r in self._rows] if width and self._rows_for == width else None
        self._lay_out(width, texts, keys)
        if before is None or len(before) != len(self._rows):
            self.refresh(layout=True)
        elif not self._in_view():
            self._unseen = True
        else:
            dirty = [Region(0, y, width, 1) for y, row in enumerate(self._rows) if text_key(row) != before[y]]
            if dirty:
                self.refresh(*dirty)

    def _lay_out(self, width: int, texts: list[Text], keys: list[tuple]) -> None:
        self._texts, self._keys, self._texts_for = texts, keys, width
        self._rows_for = None
        if width:
            console = self.app.console
            self._rows = [row for t in texts for row in wrap(t, console, width, self.HANG)]
            self._rows_for = width
            self._layouts += 1

    def _in_view(self) -> bool:
        try:
            geometry = self.screen.find_widget(self)
        except (NoScreen, NoWidget):  # not laid out yet
            return True
        return bool(geometry.visible_region)

    def render(self) -> Text:
        """Everything shown, as one text (its rows joined by newlines); the screen is drawn by render_line."""
        width = self.size.width
        return Text("\n").join(self.rows(width) if width else self.texts(width))

    def rows(self, width: int) -> list[Text]:
        """The texts wrapped (or cut) to width: one text per row."""
        width = max(1, width)
        if self._rows_for != width:
            if self._texts_for == width:
                self._lay_out(width, self._texts, self._keys or [])
            else:
                texts = self.texts(width)
                self._lay_out(width, texts, [text_key(t) for t in texts])
        return self._rows

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.rows(width))

    def render_lines(self, crop: Region) -> list[Strip]:
        if self._unseen:  # what Textual kept of it is from before the change
            self._unseen = False
            self.refresh()
        self._base = None  # looked up by the first render_line of this pass, if Textual asks for any line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        if self._base is None:
            self._base = self.rich_style   # (worked out from every ancestor's styles: once a render pass)
            self._draw(self._base)
        return self._strips[y] if y < len(self._strips) else Strip.blank(self.size.width, self._base)

    def _draw(self, base: Style) -> None:
        """The strips of the rows at the current width over base, reusing those of unchanged rows."""
        width = self.size.width
        rows = self.rows(width)
        drawn_for = (self._layouts, width, base)
        if self._strips_for == drawn_for:
            return
        same_look = self._strips_for is not None and self._strips_for[1:] == drawn_for[1:]
        old, self._cache, self._strips = (self._cache if same_look else {}), {}, []
        console = self.app.console
        for row in rows:
            key = text_key(row)
            strip = self._cache.get(key) or old.get(key) or text_strip(row, console, width, base)
            self._cache[key] = strip
            self._strips.append(strip)
        self._strips_for = drawn_for


def wrap(t: Text, console: Console, width: int, hang: int = 0) -> list[Text]:
    """t's rows at width; with hang, every line's rows after its first start `hang` columns in.

    Lines that fit are rows as they are: Rich's wrapping (divide, wrap, join) is the slow part."""
    lines = t.split("\n") if "\n" in t.plain else [t]
    rows: list[Text] = []
    for line in lines:
        if line.cell_len <= width:
            rows.append(line)
        elif not hang or width <= hang:
            rows.extend(line.wrap(console, width))
        else:
            head, body = line[:hang], line[hang:]
            head.pad_right(hang - head.cell_len)
            for i, part in enumerate(body.wrap(console, width - hang, overflow="fold")):
                rows.append(Text.assemble(head if i == 0 else " " * hang, part))
    return rows


def text_strip(row: Text, console: Console, width: int, base: Style) -> Strip:
    """One row of text as a strip of width cells over base (the widget's style)."""
    style = base + console.get_style(row.style, default=Style.null()) if row.style else base
    segments = _flat(row, console, style)
    if segments is None:   # spans that overlap: Rich stacks their styles
        segments = list(Segment.apply_style(row.render(console, end=""), style))
    return Strip(segments).crop(0, width).adjust_cell_length(width, Style.from_color(bgcolor=base.bgcolor))


def _flat(row: Text, console: Console, style: Style) -> list[Segment] | None:
    """row's segments over style when no two of its spans overlap (a text built by appending: every row
    here), as Rich would render them, without its stack of styles per character; None otherwise."""
    plain, get_style = row.plain, console.get_style
    segments, at = [], 0
    for span in sorted(row.spans, key=lambda sp: sp.start) if row.spans else ():
        if span.start < at:
            return None
        start, end = span.start, min(span.end, len(plain))
        if start >= end:
            continue
        if start > at:
            segments.append(Segment(plain[at:start], style))
        segments.append(Segment(plain[start:end], style + get_style(span.style, default=Style.null())))
        at = end
    if at < len(plain):
        segments.append(Segment(plain[at:], style))
    return segments

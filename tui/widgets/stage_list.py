"""The plan's stages as one widget drawn with Textual's line API (as DataTable and OptionList draw theirs).

One widget instead of a widget per stage: a frame that touches the plan renders one widget, not every
visible stage row, and a stage whose line changes (a running stage's progress, every second on a live
node) repaints that line alone. Each stage is its text wrapped under a hanging indent, one column in,
a blank line after it; the selected stage has a thick bar on its left over the `--selected` background,
a finished one its text at the `--done` opacity, all from the component classes' styles. Each line's
strip is kept while the line's text, look and width are the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.geometry import Region, Size
from textual.message import Message
from textual.renderables.text_opacity import TextOpacity
from textual.strip import Strip
from textual.widget import Widget

from tui.widgets.lines import text_key, text_strip, wrap

BAR = "█"
"""The selected stage's left edge (Textual's `thick` border)."""


@dataclass(frozen=True)
class StageEntry:
    """A stage as listed: its text, and whether it is selected and finished (drawn dimmer)."""

    stage_id: str
    text: Text
    selected: bool = False
    done: bool = False


@dataclass(frozen=True)
class _Line:
    entry: int
    """Index of its stage; -1 for the blank line between stages."""
    row: Text | None
    look: tuple
    """What its strip is drawn from besides the width and the widget's styles: the row's text_key, and
    whether its stage is selected and done."""
    selected: bool = False
    done: bool = False


GAP = _Line(-1, None, ())


def _same(a: StageEntry, b: StageEntry) -> bool:
    """The same stage shown the same way (the same text object: its maker keeps a text while it holds)."""
    return a.text is b.text and a.stage_id == b.stage_id and a.selected == b.selected and a.done == b.done


class StageList(Widget):
    """The stages, in the order given to `show`; a click on a stage posts `Clicked`."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"stage-list--selected", "stage-list--bar", "stage-list--done"}

    DEFAULT_CSS = """
    StageList {
        height: auto;
        margin: 0 0 1 0;
    }
    StageList > .stage-list--selected {
        background: $boost;
    }
    StageList > .stage-list--bar {
        background: $boost;
        color: $accent;
    }
    StageList > .stage-list--done {
        text-opacity: 80%;
    }
    """

    HANG = 2   # wrapped title and check lines stay under the title, not at column 0
    INDENT = 1   # the column left of the text: blank, or the selected stage's bar

    class Clicked(Message):
        def __init__(self, stage_id: str):
            super().__init__()
            self.stage_id = stage_id

    def __init__(self, **kw):
        super().__init__(**kw)
        self.entries: tuple[StageEntry, ...] = ()
        self._lines: list[_Line] = []
        self._lines_for: int | None = None
        """Width the lines were wrapped for; None: wrap again."""
        self._made: dict[int, tuple[StageEntry, int, list[_Line]]] = {}
        """id of a text shown -> (its entry, kept so that the id stays its own; its index; its lines)."""
        self._strips: dict[tuple, Strip] = {}
        """A line's key and look -> its strip, as last drawn at _strips_for."""
        self._strips_for: tuple[int, Style] | None = None
        """(width, base style) the strips were drawn at."""
        self._checked = False
        """The base style was looked up in this render pass."""

    def show(self, entries: tuple[StageEntry, ...]) -> None:
        """List these stages: lay out again when the number of lines changes, else repaint the changed lines."""
        if len(entries) == len(self.entries) and all(map(_same, entries, self.entries)):
            return
        self.entries = entries
        if self.display != bool(entries):
            self.display = bool(entries)
        width = self.size.width
        if not width or self._lines_for != width:
            self._lines_for = None
            self.refresh(layout=True)
            return
        before = self._lines
        self._lay_out(width)
        if len(self._strips) > 2 * len(self._lines):   # strips of lines no longer shown
            looks = {line.look for line in self._lines}
            self._strips = {look: strip for look, strip in self._strips.items() if look in looks}
        if len(before) != len(self._lines):
            self.refresh(layout=True)
            return
        dirty = [Region(0, y, width, 1) for y, (a, b) in enumerate(zip(before, self._lines, strict=True))
                 if a is not b and a.look != b.look]
        if dirty:
            self.refresh(*dirty)

    def text_of(self, stage_id: str) -> Text | None:
        """The text shown for a stage (None if it is not listed)."""
        return next((e.text for e in self.entries if e.stage_id == stage_id), None)

    def span_of(self, stage_id: str) -> Region | None:
        """The lines of a stage and the blank line after it, in this widget's coordinates (None if it is not
        listed or not laid out)."""
        index = next((i for i, e in enumerate(self.entries) if e.stage_id == stage_id), None)
        at = [y for y, line in enumerate(self._lines) if line.entry == index] if self._lines_for else []
        if not at:
            return None
        gap = int(at[-1] + 1 < len(self._lines))
        return Region(0, at[0], self.size.width, len(at) + gap)

    def _lay_out(self, width: int) -> None:
        """The lines of every stage at width; a stage shown the same way before at this width keeps its lines."""
        console, lines = self.app.console, []
        text_width = max(1, width - self.INDENT)
        made_before = self._made if self._lines_for == width else {}
        self._made = {}
        for i, e in enumerate(self.entries):
            if i:
                lines.append(GAP)
            made = made_before.get(id(e.text))
            if made is None or made[1] != i or not _same(made[0], e):
                made = e, i, [_Line(i, row, (text_key(row), e.selected, e.done), e.selected, e.done)
                              for row in wrap(e.text, console, text_width, self.HANG)]
            self._made[id(e.text)] = made
            lines += made[2]
        self._lines, self._lines_for = lines, width

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self._lines_for != width:
            self._lay_out(width)
        return len(self._lines)

    def notify_style_update(self) -> None:
        """A theme or CSS change: the bar, selection and done looks may differ with the same base style."""
        super().notify_style_update()
        self._strips_for = None

    def render_lines(self, crop: Region) -> list[Strip]:
        self._checked = False   # the base style is looked up by this pass's first render_line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if not self._checked:
            self._checked = True
            drawn_at = (width, self.rich_style)   # (worked out from every ancestor's styles: once a pass)
            if self._strips_for != drawn_at:
                self._strips, self._strips_for = {}, drawn_at
        if self._lines_for != width:
            self._lay_out(width)
        base = self._strips_for[1] if self._strips_for else self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, base)
        line = self._lines[y]
        strip = self._strips.get(line.look)
        if strip is None:
            strip = self._strips[line.look] = self._strip(line, width, base)
        return strip

    def _strip(self, line: _Line, width: int, base: Style) -> Strip:
        blank = Style.from_color(bgcolor=base.bgcolor)   # (as Textual draws margins and padding)
        if line.row is None:
            return Strip.blank(width, blank)
        style = self.get_component_rich_style("stage-list--selected") if line.selected else base
        text = text_strip(line.row, self.app.console, width - self.INDENT, style)
        if line.done:
            opacity = self.get_component_styles("stage-list--done").text_opacity
            text = Strip(TextOpacity.process_segments(text, opacity, self.app.ansi_theme,
                                                      self.app.native_ansi_color))
        edge = (Segment(BAR, self.get_component_rich_style("stage-list--bar")) if line.selected
                else Segment(" ", blank))
        return Strip([edge, *text], width)

    def on_click(self, event: events.Click) -> None:
        if 0 <= event.y < len(self._lines) and (entry := self._lines[event.y].entry) >= 0:
            self.post_message(self.Clicked(self.entries[entry].stage_id))

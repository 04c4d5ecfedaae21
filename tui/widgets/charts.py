"""The dashboard's line charts: options (smoothing, log scale, window) and a widget (stats over a figure) that
redraws only on change."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from ops.textsafe import shown
from tui.source import ChartSeries
from tui.widgets.lines import text_key, text_strip, wrap
from tui.widgets.plot import Figure, Line, StripCache, TimeWindow, draw

SMOOTHING = (0.0, 0.6, 0.9, 0.99)
"""EMA weights the smoothing key steps through (0: off)."""
WINDOWS_S = (300.0, 1800.0, None)
"""Time windows of the tok/s chart the window key steps through (None: everything kept)."""


@dataclass(frozen=True)
class ChartOptions:
    """How the dashboard's charts draw their data (one set for all, changed with keys)."""

    smoothing: float = 0.0
    """EMA weight of the previous smoothed value (W&B's slider); 0 draws the raw values."""
    log_y: bool = False
    window_s: float | None = WINDOWS_S[0]
    """The tok/s chart shows the last window_s seconds; None: all of it."""

    def next_smoothing(self) -> "ChartOptions":
        i = SMOOTHING.index(self.smoothing) if self.smoothing in SMOOTHING else -1
        return replace(self, smoothing=SMOOTHING[(i + 1) % len(SMOOTHING)])

    def next_window(self) -> "ChartOptions":
        i = WINDOWS_S.index(self.window_s) if self.window_s in WINDOWS_S else -1
        return replace(self, window_s=WINDOWS_S[(i + 1) % len(WINDOWS_S)])

    def describe(self) -> str:
        """`EMA 0.9 · log y · last 5m` for the notification after a key."""
        window = "all" if self.window_s is None else f"last {int(self.window_s // 60)}m"
        ema = f"EMA {self.smoothing:g}" if self.smoothing else "no smoothing"
        return f"{ema} · {'log' if self.log_y else 'linear'} y · tok/s {window}"


def ema(ys: Sequence[float], weight: float) -> tuple[float, ...]:
    """Debiased exponential moving average (as TensorBoard/W&B smooth): early points are not pulled to 0."""
    if not weight:
        return tuple(ys)
    out, acc, norm = [], 0.0, 0.0
    for y in ys:
        if not math.isfinite(y):
            out.append(y)
            continue
        acc = weight * acc + (1 - weight) * y
        norm = weight * norm + (1 - weight)
        out.append(acc / norm)
    return tuple(out)


def for_display(s: ChartSeries, opts: ChartOptions) -> ChartSeries:
    """The series as drawn: smoothed, and on a log axis without the values a log cannot show."""
    ys = ema(s.y, opts.smoothing)
    if not opts.log_y:
        return ChartSeries(s.x, ys)
    kept = [(x, y) for x, y in zip(s.x, ys) if y > 0]
    return ChartSeries(tuple(x for x, _ in kept), tuple(y for _, y in kept))


class LineChart(Widget):
    """A panel's latest values (`stats`, lines of text) over a figure of up to two series (left and right y
    axis) on a shared x, drawn by tui.widgets.plot: one widget, so a panel is one widget to render.

    An `overlay` (the previous run of the same stage) is drawn grey on the left axis, a `right_overlay` (the
    eval's acceptance under the served one) grey on the right axis. The strips are made
    once per new data, stats, options or size and then only handed out (Textual's line API); rows drawn as
    before keep their strips and only changed rows are repainted."""

    DEFAULT_CSS = """
    LineChart {
        height: 1fr;
        min-height: 5;
    }
    """

    def __init__(self, title: str = "", stats: Text | None = None, **kw):
        super().__init__(**kw)
        self._title = title
        self.stats: tuple[Text, ...] = () if stats is None else (stats,)
        """The lines above the figure (each wraps to the width unless it is no_wrap), as last set."""
        self.figure_shown = False
        """Whether the figure is drawn below the stats (there is data to draw)."""
        self._stats_key: tuple = (tuple(text_key(t) for t in self.stats), False)
        self._key: tuple | None = None
        self._last: tuple | None = None
        self._figure: Figure | None = None
        self._strips: list[Strip] = []
        self._cache = StripCache()
        """The figure's strips of the last drawing, for rows drawn the same again."""
        self._stat_strips: dict[tuple, Strip] = {}
        """The stats rows' strips of the last drawing, by row text, width and style."""
        self._drawn_for: tuple | None = None
        """(size, base style) the strips were drawn for; None: draw again."""
        self._base: Style | None = None
        """The widget's style in the current render pass (None until a line is asked for)."""
        self.options = ChartOptions()

    def set_options(self, options: ChartOptions) -> None:
        """Draw with options from now on (at once, with the data last given)."""
        self.options = options
        if self._last is not None and self.figure_shown:   # a hidden figure stays hidden until new data
            self.plot(*self._last)

    def set_stats(self, *lines: Text) -> None:
        """Show only these lines (no data to draw: the figure is hidden)."""
        if self._set_stats(lines, figure=False):
            self._repaint()

    def _set_stats(self, lines: tuple[Text, ...], figure: bool) -> bool:
        key = (tuple(text_key(t) for t in lines), figure)
        if key == self._stats_key:
            return False
        self.stats, self.figure_shown, self._stats_key = lines, figure, key
        return True

    def plot(self, left: tuple[str, ChartSeries], right: tuple[str, ChartSeries] | None = None, xlabel: str = "",
             overlay: tuple[str, ChartSeries] | None = None, window: TimeWindow | None = None,
             right_overlay: tuple[str, ChartSeries] | None = None, stats: tuple[Text, ...] | None = None) -> bool:
        """Draw the series (over a time window: x on the window's clock) below stats (None: those last set);
        returns False (and draws nothing) when nothing changed since the last call."""
        self._last = (left, right, xlabel, overlay, window, right_overlay)
        restated = self._set_stats(self.stats if stats is None else stats, figure=True)
        key = (left[0], _sig(left[1]), right and right[0], right and _sig(right[1]), xlabel,
               overlay and overlay[0], overlay and _sig(overlay[1]), self.options, window,
               right_overlay and right_overlay[0], right_overlay and _sig(right_overlay[1]))
        if key == self._key and not restated:
            return False
        if key != self._key:
            self._key = key
            opts = self.options
            lines = []
            if overlay is not None and len(overlay[1]):
                lines.append(_line(overlay[0], for_display(overlay[1], opts), "grey50"))
            if len(left[1]):
                lines.append(_line(left[0], for_display(left[1], opts), "cyan"))
            if right_overlay is not None and len(right_overlay[1]) and right is not None and len(right[1]):
                lines.append(_line(right_overlay[0], right_overlay[1], "grey50", right=True))
            if right is not None and len(right[1]):
                lines.append(_line(right[0], ChartSeries(right[1].x, ema(right[1].y, opts.smoothing)), "magenta",
                                   right=True))
            self._figure = Figure(self._title, tuple(lines), xlabel, opts.log_y, window)
        self._repaint()
        return True

    def _repaint(self) -> None:
        """Draw again over the style of the last paint (working out rich_style walks every ancestor's styles; a
        restyle since then repaints every row, drawn again in render_line) and repaint the rows that changed
        (all of them when their number did). Never painted: its first render pass draws it."""
        if self._drawn_for is None:
            self.refresh()
            return
        w = self.size.width
        size, base = self._drawn_for
        old = self._strips if size == self.size else None
        self._strips = self._draw(base)
        self._drawn_for = (self.size, base)
        if old is None or len(old) != len(self._strips):
            self.refresh()
            return
        dirty = [Region(0, y, w, 1) for y, (a, b) in enumerate(zip(old, self._strips)) if a != b]
        if dirty:
            self.refresh(*dirty)

    def _draw(self, base: Style) -> list[Strip]:
        """Every row at the current size over base: the stats' rows, then the figure in the rows left."""
        w, h = self.size
        if not (w and h):
            return []
        console = self.app.console
        rows = [row for t in self.stats for row in wrap(t, console, w)][:h]
        old, self._stat_strips = self._stat_strips, {}
        strips = []
        for row in rows:
            key = (text_key(row), w, base)
            strip = self._stat_strips.get(key) or old.get(key) or text_strip(row, console, w, base)
            self._stat_strips[key] = strip
            strips.append(strip)
        if self.figure_shown and self._figure is not None and h > len(rows):
            strips += draw(self._figure, w, h - len(rows), base, self._cache)
        return strips

    def render_lines(self, crop: Region) -> list[Strip]:
        self._base = None  # looked up by the first render_line of this pass, if Textual asks for any line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        if self._base is None:
            self._base = self.rich_style
            if self._drawn_for != (self.size, self._base):  # resized, or restyled
                self._strips = self._draw(self._base)
                self._drawn_for = (self.size, self._base)
        return self._strips[y] if y < len(self._strips) else Strip.blank(self.size.width, self._base)


def _line(label: str, s: ChartSeries, color: str, right: bool = False) -> Line:
    return Line(shown(label), np.asarray(s.x, dtype=np.float64), np.asarray(s.y, dtype=np.float64), color, right)


def _sig(s: ChartSeries) -> tuple:
    if not len(s):
        return (0,)
    return (len(s), s.x[0], s.x[-1], s.y[-1], sum(s.y))

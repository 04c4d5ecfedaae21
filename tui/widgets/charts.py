"""The dashboard's line charts: options (smoothing, log scale, window) and a widget that redraws only on change."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from ops.textsafe import shown
from tui.source import ChartSeries
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
    """Up to two series (left and right y axis) over a shared x, drawn by tui.widgets.plot.

    An `overlay` (the previous run of the same stage) is drawn grey on the left axis. The strips are
    made once per new data, options or size and then only handed out (Textual's line API)."""

    DEFAULT_CSS = """
    LineChart {
        height: 1fr;
        min-height: 5;
    }
    """

    def __init__(self, title: str = "", **kw):
        super().__init__(**kw)
        self._title = title
        self._key: tuple | None = None
        self._last: tuple | None = None
        self._figure: Figure | None = None
        self._strips: list[Strip] = []
        self._cache = StripCache()
        """The strips of the last drawing, for rows drawn the same again."""
        self._drawn_for: tuple | None = None
        """(size, base style) the strips were drawn for; None: draw again."""
        self._base: Style | None = None
        """The widget's style in the current render pass (None until a line is asked for)."""
        self.options = ChartOptions()

    def set_options(self, options: ChartOptions) -> None:
        """Draw with options from now on (at once, with the data last given)."""
        self.options = options
        if self._last is not None:
            self.plot(*self._last)

    def plot(self, left: tuple[str, ChartSeries], right: tuple[str, ChartSeries] | None = None, xlabel: str = "",
             overlay: tuple[str, ChartSeries] | None = None, window: TimeWindow | None = None) -> bool:
        """Draw the series (over a time window: x on the window's clock); returns False (and draws nothing)
        when nothing changed since the last call."""
        self._last = (left, right, xlabel, overlay, window)
        key = (left[0], _sig(left[1]), right and right[0], right and _sig(right[1]), xlabel,
               overlay and overlay[0], overlay and _sig(overlay[1]), self.options, window)
        if key == self._key:
            return False
        self._key = key
        opts = self.options
        lines = []
        if overlay is not None and len(overlay[1]):
            lines.append(_line(overlay[0], for_display(overlay[1], opts), "grey50"))
        if len(left[1]):
            lines.append(_line(left[0], for_display(left[1], opts), "cyan"))
        if right is not None and len(right[1]):
            lines.append(_line(right[0], ChartSeries(right[1].x, ema(right[1].y, opts.smoothing)), "magenta",
                               right=True))
        self._figure = Figure(self._title, tuple(lines), xlabel, opts.log_y, window)
        if self._drawn_for is None:   # never painted: its first render pass draws it
            self.refresh()
        else:   # over the style of the last paint (working out rich_style walks every ancestor's styles); a
            self._redraw(self._drawn_for[1])   # restyle since then repaints every row, redrawn in render_line
        return True

    def _redraw(self, base: Style) -> None:
        """Draw the figure at the current size and repaint the rows that changed (all of them when the
        size or the style did)."""
        w, h = self.size
        old = self._strips if self._drawn_for == (self.size, base) else None
        self._strips = [] if self._figure is None or not (w and h) else draw(self._figure, w, h, base, self._cache)
        self._drawn_for = (self.size, base)
        if old is None or len(old) != len(self._strips):
            self.refresh()
            return
        dirty = [Region(0, y, w, 1) for y, (a, b) in enumerate(zip(old, self._strips)) if a != b]
        if dirty:
            self.refresh(*dirty)

    def render_lines(self, crop: Region) -> list[Strip]:
        self._base = None  # looked up by the first render_line of this pass, if Textual asks for any line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        if self._base is None:
            self._base = self.rich_style
            if self._drawn_for != (self.size, self._base):  # resized, or restyled
                w, h = self.size
                self._strips = [] if self._figure is None else draw(self._figure, w, h, self._base, self._cache)
                self._drawn_for = (self.size, self._base)
        return self._strips[y] if y < len(self._strips) else Strip.blank(self.size.width, self._base)


def _line(label: str, s: ChartSeries, color: str, right: bool = False) -> Line:
    return Line(shown(label), np.asarray(s.x, dtype=np.float64), np.asarray(s.y, dtype=np.float64), color, right)


def _sig(s: ChartSeries) -> tuple:
    if not len(s):
        return (0,)
    return (len(s), s.x[0], s.x[-1], s.y[-1], sum(s.y))

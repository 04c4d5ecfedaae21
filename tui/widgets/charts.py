"""A PlotextPlot that only rebuilds when its data or its display options changed."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from textual_plotext import PlotextPlot

from tui.source import ChartSeries

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


class LineChart(PlotextPlot):
    """Up to two series (left and right y axis) over a shared x; redraws only on new data or options.

    An `overlay` (the previous run of the same stage) is drawn dimmer on the left axis."""

    def __init__(self, title: str = "", **kw):
        super().__init__(**kw)
        self._title = title
        self._key: tuple | None = None
        self._last: tuple | None = None
        self.options = ChartOptions()

    def set_options(self, options: ChartOptions) -> None:
        """Draw with options from now on (at once, with the data last given)."""
        self.options = options
        if self._last is not None:
            self.plot(*self._last)

    def plot(self, left: tuple[str, ChartSeries], right: tuple[str, ChartSeries] | None = None, xlabel: str = "",
             overlay: tuple[str, ChartSeries] | None = None) -> bool:
        """Draw the series; returns False (and draws nothing) when nothing changed since the last call."""
        self._last = (left, right, xlabel, overlay)
        key = (left[0], _sig(left[1]), right and right[0], right and _sig(right[1]), xlabel,
               overlay and overlay[0], overlay and _sig(overlay[1]), self.options)
        if key == self._key:
            return False
        self._key = key
        opts = self.options
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self._title)
        if xlabel:
            plt.xlabel(xlabel)
        if opts.log_y:
            plt.yscale("log")
        if overlay is not None and len(overlay[1]):
            o = for_display(overlay[1], opts)
            plt.plot(list(o.x), list(o.y), label=overlay[0], marker="braille", color="gray")
        name, s = left
        if len(s):
            d = for_display(s, opts)
            plt.plot(list(d.x), list(d.y), label=name, marker="braille", color="cyan")
        if right is not None and len(right[1]):
            r = ChartSeries(right[1].x, ema(right[1].y, opts.smoothing))
            plt.plot(list(r.x), list(r.y), label=right[0], marker="braille", color="magenta", yside="right")
        self.refresh()
        return True


def _sig(s: ChartSeries) -> tuple:
    if not len(s):
        return (0,)
    return (len(s), s.x[0], s.x[-1], s.y[-1], sum(s.y))

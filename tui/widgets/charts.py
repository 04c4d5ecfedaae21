"""A PlotextPlot that only rebuilds when its data changed."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from tui.source import ChartSeries


class LineChart(PlotextPlot):
    """Up to two series (left and right y axis) over a shared x; redraws only on new data."""

    def __init__(self, title: str = "", **kw):
        super().__init__(**kw)
        self._title = title
        self._key: tuple | None = None

    def plot(self, left: tuple[str, ChartSeries], right: tuple[str, ChartSeries] | None = None, xlabel: str = "") -> bool:
        """Draw the series; returns False (and draws nothing) when nothing changed since the last call."""
        key = (left[0], _sig(left[1]), right and right[0], right and _sig(right[1]), xlabel)
        if key == self._key:
            return False
        self._key = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self._title)
        if xlabel:
            plt.xlabel(xlabel)
        name, s = left
        if len(s):
            plt.plot(list(s.x), list(s.y), label=name, marker="braille", color="cyan")
        if right is not None and len(right[1]):
            plt.plot(list(right[1].x), list(right[1].y), label=right[0], marker="braille", color="magenta", yside="right")
        self.refresh()
        return True


def _sig(s: ChartSeries) -> tuple:
    if not len(s):
        return (0,)
    return (len(s), s.x[0], s.x[-1], s.y[-1], sum(s.y))

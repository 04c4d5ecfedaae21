"""Charts drawn as braille strips: ticks people can read, both y axes, the legend, log scale, gaps at NaN."""

from __future__ import annotations

import math

import numpy as np
from rich.style import Style

from tui.widgets.plot import BRAILLE, Figure, Line, StripCache, TimeWindow, draw, nice_step, tick_label

BASE = Style(color="white", bgcolor="black")


def rows(fig: Figure, width: int = 40, height: int = 12) -> list[str]:
    strips = draw(fig, width, height, BASE)
    assert len(strips) == height and all(s.cell_length == width for s in strips)
    return ["".join(seg.text for seg in s) for s in strips]


def line(xs, ys, label="loss", color="cyan", right=False) -> Line:
    return Line(label, np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), color, right)


def plot_area(text: list[str]) -> list[str]:
    """The braille cells of each plot row (between the y axis and the end)."""
    return [r.split("│" if "┤" not in r else "┤", 1)[1] if ("│" in r or "┤" in r) else "" for r in text[1:-3]]


def test_ticks_are_1_2_5_steps_with_as_many_decimals_as_the_step_needs():
    assert [nice_step(x) for x in (0.03, 0.7, 1.3, 2.2, 3, 7, 24_000)] == [0.05, 1, 2, 2.5, 5, 10, 25_000]
    assert [tick_label(v, 25_000) for v in (0, 25_000, 100_000)] == ["0", "25k", "100k"]
    assert [tick_label(v, 2_500) for v in (2_500, 5_000, 7_500)] == ["2.5k", "5k", "7.5k"]
    assert [tick_label(v, 0.05) for v in (0.05, 0.1, 0.3)] == ["0.05", "0.1", "0.3"]
    assert [tick_label(v, 50) for v in (-100, -50, 0)] == ["-100", "-50", "0"]


def test_a_rising_line_with_title_legend_axes_and_label():
    text = rows(Figure("training", (line(range(100), range(100)),), xlabel="step"))
    assert "training" in text[0] and "━ loss" in text[0]
    assert text[-1].strip() == "step"
    assert "└" in text[-3] and "┬" in text[-3]
    assert {"0", "50"} <= set(text[-2].split())                     # x tick labels under the ticks
    assert any(r.lstrip().startswith("50┤") for r in text)           # a y tick label on its row
    cells = plot_area(text)
    assert cells[-1].lstrip()[0] != " " and cells[0].rstrip()[-1] != " "   # bottom left to top right
    assert cells[0].strip() and cells[0][0] == " " and cells[-1][-1] == " "


def test_the_right_axis_has_its_own_scale_and_the_legend_says_so():
    fig = Figure("t", (line([0, 1, 2], [8.0, 4.0, 1.0]), line([0, 1, 2], [0.1, 0.4, 0.7], "acc", "magenta", True)))
    text = rows(fig)
    assert "━ acc (right)" in text[0]
    right_labels = [r.rsplit("├", 1)[1].strip() for r in text if "├" in r]
    assert right_labels and all(0.1 <= float(v) <= 0.7 for v in right_labels)
    left_labels = [r.split("┤", 1)[0].strip() for r in text if "┤" in r]
    assert left_labels and all(1 <= float(v) <= 8 for v in left_labels)


def test_log_scale_ticks_at_powers_of_ten():
    ys = [10 ** (3 * i / 99) for i in range(100)]
    text = rows(Figure("t", (line(range(100), ys),), log_y=True), height=14)
    labels = [r.split("┤", 1)[0].strip() for r in text if "┤" in r]
    assert labels == ["1000", "100", "10", "1"]


def test_nan_leaves_a_gap_and_a_single_point_is_one_dot():
    text = rows(Figure("t", (line([0, 1, 2, 3, 4], [1, 1, math.nan, 1, 1]),)), width=24)
    flat = next(r for r in plot_area(text) if r.strip())
    cells = flat.rstrip()
    assert " " in cells.strip()                                     # the gap around the NaN
    one = rows(Figure("t", (line([5], [2.0]),)), width=24)
    dots = [c for r in plot_area(one) for c in r if c != " "]
    assert len(dots) == 1 and BRAILLE < ord(dots[0]) < BRAILLE + 256


def test_too_small_to_plot_leaves_only_the_header():
    strips = draw(Figure("t", (line([0, 1], [0, 1]),), xlabel="x"), 30, 3, BASE)
    assert len(strips) == 1 and "t" in "".join(seg.text for seg in strips[0])


def test_each_cell_with_dots_has_its_line_s_colour_and_blanks_join_the_run_before_them():
    """Two lines crossing: every braille cell is drawn in the colour of the line whose dots it shows (the
    later line where both have dots), blanks only extend a run (a space looks the same in any foreground),
    so a row is a few segments, not one per stretch of dots and gap."""
    xs = np.linspace(0, 1, 200)
    fig = Figure("t", (line(xs, np.sin(xs * 20)), line(xs, np.cos(xs * 20), "b", "magenta")))
    strips = draw(fig, 60, 20, BASE)
    cyan, magenta = (BASE + Style(color=c) for c in ("cyan", "magenta"))
    coloured = 0
    for strip in strips[1:-3]:
        segs = list(strip)
        axis, plot = segs[0], segs[1:]
        assert axis.style == BASE and set(axis.text[-1]) <= {"│", "┤"}
        assert all(a.style != b.style for a, b in zip(plot, plot[1:]))   # runs of one colour are one segment
        for prev, seg in zip([None, *plot], plot):
            assert seg.style in (cyan, magenta) or (prev is None and seg.style == BASE and not seg.text.strip())
            assert not seg.text[:1].isspace() or prev is None   # a run starts at dots, or at the row's start
            coloured += sum(1 for ch in seg.text if ch != " ")
    assert coloured > 60
    both = draw(Figure("t", (line(xs, np.sin(xs * 20)),)), 60, 20, BASE)
    only_cyan = {seg.style for strip in both[1:-3] for seg in list(strip)[1:] if seg.text.strip()}
    assert only_cyan == {cyan}


def test_a_time_window_holds_each_point_in_its_column_while_the_clock_runs():
    """Over a time window the chart shows the window (ticks in seconds before its end), not the data's
    extent: points older than the window are left out, also from the y axis, and the drawing does not move
    until the clock passes the next dot column; a series that moved on with the clock draws the same."""
    now = 1_764_800_000.0
    xs = np.arange(now - 600, now + 1)
    ys = 100 + 10 * np.sin(xs / 7)
    ys[xs < now - 400] = 10_000.0   # older than the window: must not reach the y axis
    width, height = 50, 16

    def drawn(t: float, shift: float = 0.0) -> list[str]:
        fig = Figure("tok/s", (line(xs + shift, ys),), "seconds ago", window=TimeWindow(300.0, t))
        return ["".join(seg.text for seg in s) for s in draw(fig, width, height, BASE)]

    first = drawn(now)
    labels = first[-2].split()
    assert labels[0] == "-300" and labels[-1] == "0"
    assert all(float(r.split("┤")[0]) < 200 for r in first if "┤" in r)   # 10 000 is older than the window
    cols = width - len(first[1].split("┤")[0].split("│")[0]) - 1
    step = 300.0 / (2 * cols - 1)
    end = math.ceil(now / step) * step
    assert drawn(end - step + 1e-3) == first == drawn(end)   # anywhere in one column: the same drawing
    later = drawn(end + step, shift=step)   # one column on, the series one column on too
    assert later == first
    assert drawn(end + step) != first      # the same series one column later has moved


def test_a_strip_cache_hands_out_the_previous_strips_of_rows_drawn_the_same():
    xs = np.arange(200.0)
    ys = np.sin(xs / 9)
    cache = StripCache()
    first = draw(Figure("t", (line(xs, ys),), "step"), 50, 16, BASE, cache)
    again = draw(Figure("t", (line(xs, ys),), "step"), 50, 16, BASE, cache)
    assert all(a is b for a, b in zip(first, again))
    ys2 = ys.copy()
    ys2[-1] = -0.5   # the last point drops: only the rows of the newest column change
    moved = draw(Figure("t", (line(xs, ys2),), "step"), 50, 16, BASE, cache)
    same = [a is b for a, b in zip(again, moved)]
    assert 0 < same.count(False) < 8 and same[0] and same[-1]
    assert [s.text for s in moved] == [s.text for s in draw(Figure("t", (line(xs, ys2),), "step"), 50, 16, BASE)]
    other = draw(Figure("t", (line(xs, ys2),), "step"), 50, 16, Style(color="red", bgcolor="black"), cache)
    assert not any(a is b for a, b in zip(moved, other))   # another base style: nothing reused

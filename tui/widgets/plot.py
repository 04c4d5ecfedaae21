"""Line charts drawn straight into strips: braille dots, nice ticks, O(points + cells) per frame.

A cell holds 2x4 braille dots. Each line's points are mapped to dots and joined
with straight segments (vectorised), so a min/max-decimated series (two points
per column, see ops.telemetry.history) draws its whole envelope. A cell shows
the dots of the last line drawn in it, in that line's colour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

T = TypeVar("T")
BRAILLE = 0x2800
DOT_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.uint8)
"""Braille bit of the dot at [row in cell][column in cell]."""
LEGEND_MARK = "━"


@dataclass(frozen=True)
class Line:
    """One series as drawn (already smoothed and, for a log axis, positive)."""

    label: str
    x: np.ndarray
    y: np.ndarray
    color: str
    right: bool = False
    """On the right y axis (its own scale)."""


@dataclass(frozen=True)
class Figure:
    title: str
    lines: tuple[Line, ...]
    """Drawn in order: a later line covers an earlier one where both have dots in a cell."""
    xlabel: str = ""
    log_y: bool = False
    """The left axis is logarithmic (the right one stays linear)."""
    window: TimeWindow | None = None
    """x is time: show the window, not the data's extent."""


@dataclass(frozen=True)
class TimeWindow:
    """An x axis of the last `seconds` up to `now` (x in the same clock), its ticks in seconds before its end.

    The end is `now` rounded up to the next dot column, so a point keeps its column while the clock
    runs and the whole chart moves one dot when the end passes the next column: a series that gains a
    point a second changes the rows of its newest column, not every row each second."""

    seconds: float
    now: float


@dataclass(frozen=True)
class Axis:
    """A value range mapped onto `cells` rows or columns, with tick values inside it."""

    lo: float
    hi: float
    log: bool
    ticks: tuple[float, ...]
    labels: tuple[str, ...]

    def to_unit(self, v: np.ndarray) -> np.ndarray:
        """Values as 0..1 along the axis (log10 first on a log axis)."""
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.log10(v)
        lo, hi = (math.log10(self.lo), math.log10(self.hi)) if self.log else (self.lo, self.hi)
        return (v - lo) / (hi - lo)


class StripCache:
    """The strips of a chart's previous drawing by what they show, handed out again for a row drawn the
    same: making a Strip is the costly part of a row, and Textual keeps caches on each strip (its line
    filters' output among them) that a reused one keeps."""

    def __init__(self) -> None:
        self._old: dict[tuple, Any] = {}
        self._new: dict[tuple, Any] = {}

    def get(self, key: tuple, make: Callable[[], T]) -> T:
        strip = self._new.get(key) or self._old.get(key) or make()
        self._new[key] = strip
        return strip

    def turn(self) -> None:
        """A drawing is done: keep its strips (only them) for the next."""
        self._old, self._new = self._new, {}


def draw(fig: Figure, width: int, height: int, base: Style, cache: StripCache | None = None) -> list[Strip]:
    """The figure as `height` strips of `width` cells: header (title, legend), plot, x axis, x label.
    With a cache, rows drawn as in its previous drawing are its strips."""
    cache = cache if cache is not None else StripCache()
    try:
        return _draw(fig, width, height, base, cache)
    finally:
        cache.turn()


def _draw(fig: Figure, width: int, height: int, base: Style, cache: StripCache) -> list[Strip]:
    legend = tuple((ln.label, ln.color, ln.right) for ln in fig.lines)
    header = cache.get(("header", fig.title, legend, width, base), lambda: _header(fig, width, base))
    bottom = 3 if fig.xlabel else 2
    rows = height - 1 - bottom
    lines = [ln for ln in fig.lines if len(ln.x)]
    if fig.window is not None:   # (the y axis may count a point of the part-column that scrolled out)
        lines = [kept for ln in lines if len((kept := _from(ln, fig.window.now - fig.window.seconds)).x)]
    if rows < 1 or width < 12 or not lines:
        return [header][:height]
    left = [ln for ln in lines if not ln.right]
    right = [ln for ln in lines if ln.right]
    y_left = _y_axis(left or right, fig.log_y and bool(left), rows)
    y_right = _y_axis(right, False, rows) if right and left else None
    lw = max(map(len, y_left.labels), default=0)
    rw = max(map(len, y_right.labels), default=0) if y_right else 0
    cols = width - lw - 1 - (rw + 1 if y_right else 0)
    if cols < 4:
        return [header][:height]
    if fig.window is None:
        x_axis, end = _x_axis(np.concatenate([ln.x for ln in lines]), cols), 0.0
    else:
        seconds = fig.window.seconds
        step = seconds / (2 * cols - 1)   # one dot column
        end = math.ceil(fig.window.now / step) * step
        x_axis = _linear_ticked(-seconds, 0.0, False, max(2, cols // 8))
    owner = np.full((rows, cols), -1, dtype=np.int8)
    bits = np.zeros((rows, cols), dtype=np.uint8)
    for i, ln in enumerate(lines):
        axis = y_right if (ln.right and y_right is not None) else y_left
        u, y = x_axis.to_unit(ln.x - end), ln.y
        if fig.window is not None:   # drop the points of the part-column that scrolled out
            shown = u >= 0
            u, y = u[shown], y[shown]
        b = _dots(u, axis.to_unit(y), rows, cols)
        hit = b > 0
        owner[hit], bits[hit] = i, b[hit]
    styles = [base + Style(color=ln.color) for ln in lines]
    out = [header]
    left_ticks = _tick_rows(y_left, rows)
    right_ticks = _tick_rows(y_right, rows) if y_right else {}
    texts = ["".join(map(chr, row)) for row in np.where(bits > 0, BRAILLE + bits.astype(np.int32), 32).tolist()]
    drawn_over = (width, base, tuple(styles))
    for r, (text, own) in enumerate(zip(texts, _runs(owner))):
        head = f"{left_ticks.get(r, ''):>{lw}}{'┤' if r in left_ticks else '│'}"
        tail = f"{'├' if r in right_ticks else '│'}{right_ticks.get(r, ''):<{rw}}" if y_right is not None else ""

        def row(head=head, text=text, own=own, tail=tail) -> Strip:
            segs = [Segment(head, base), *_cells(text, own, styles, base)]
            if tail:
                segs.append(Segment(tail, base))
            return Strip(segs, width)

        out.append(cache.get(("row", head, text, tuple(own), tail, drawn_over), row))
    out += cache.get(("x", x_axis, cols, lw, bool(y_right), width, base),
                     lambda: _x_rows(x_axis, cols, lw, bool(y_right), width, base))
    if fig.xlabel:
        out.append(cache.get(("xlabel", fig.xlabel, lw, cols, width, base),
                             lambda: _centred([(fig.xlabel, base)], width, base, lw + 1, cols)))
    return out[:height]


def _from(ln: Line, start: float) -> Line:
    """ln without its points before start."""
    keep = ln.x >= start
    return ln if keep.all() else replace(ln, x=ln.x[keep], y=ln.y[keep])


def _header(fig: Figure, width: int, base: Style) -> Strip:
    parts: list[tuple[str, Style]] = [(fig.title, base + Style(bold=True))] if fig.title else []
    for ln in fig.lines:
        parts += [("   " if parts else "", base), (LEGEND_MARK, base + Style(color=ln.color)),
                  (f" {ln.label}{' (right)' if ln.right else ''}", base)]
    return _centred(parts, width, base, 0, width)


def _centred(parts: list[tuple[str, Style]], width: int, base: Style, start: int, span: int) -> Strip:
    strip = Strip([Segment(t, s) for t, s in parts if t])
    pad = start + max(0, (span - strip.cell_length) // 2)
    return Strip([Segment(" " * pad, base), *strip]).crop(0, width).adjust_cell_length(width, base)


def _y_axis(lines: Sequence[Line], log: bool, rows: int) -> Axis:
    ys = np.concatenate([ln.y for ln in lines])
    ys = ys[np.isfinite(ys) & (ys > 0)] if log else ys[np.isfinite(ys)]
    if not len(ys):
        return Axis(1.0, 10.0, log, (), ()) if log else Axis(0.0, 1.0, False, (), ())
    lo, hi = float(ys.min()), float(ys.max())
    if log:
        if hi <= lo:
            lo, hi = lo / 2, hi * 2
        ticks = _log_ticks(lo, hi, max(2, rows // 3))
        if ticks is not None:
            return Axis(lo, hi, True, ticks, tuple(f"{t:g}" for t in ticks))
        return _linear_ticked(lo, hi, True, max(2, rows // 3))
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    return _linear_ticked(lo, hi, False, max(2, rows // 3))


def _x_axis(xs: np.ndarray, cols: int) -> Axis:
    xs = xs[np.isfinite(xs)]
    lo, hi = (float(xs.min()), float(xs.max())) if len(xs) else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    return _linear_ticked(lo, hi, False, max(2, cols // 8))


def _linear_ticked(lo: float, hi: float, log: bool, target: int) -> Axis:
    """About `target` ticks at 1-2-5 steps inside lo..hi; finer steps until at least two fit."""
    for want in (target, 2 * target, 4 * target):
        step = nice_step((hi - lo) / want)
        first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
        ticks = [k * step for k in range(first, last + 1) if not log or k * step > 0]
        if len(ticks) >= 2:
            break
    return Axis(lo, hi, log, tuple(ticks), tuple(tick_label(t, step) for t in ticks))


def _log_ticks(lo: float, hi: float, target: int) -> tuple[float, ...] | None:
    """Ticks of a log axis inside lo..hi, about `target` of them: 1-2-5 in each decade when they fit,
    else powers of ten (every other one, or sparser, when there are too many); None if fewer than 2 fit."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))

    def inside(mantissas: tuple[int, ...]) -> list[float]:
        return [m * 10.0 ** k for k in range(k0, k1 + 1) for m in mantissas
                if lo * (1 - 1e-9) <= m * 10.0 ** k <= hi * (1 + 1e-9)]

    fine = inside((1, 2, 5))
    if 2 <= len(fine) <= target:
        return tuple(fine)
    decades = inside((1,))
    ticks = decades if len(decades) >= 2 else fine
    if len(ticks) < 2:
        return None
    return tuple(ticks[:: -(-len(ticks) // (target + 1))])


def nice_step(raw: float) -> float:
    """The 1-2-5 multiple of a power of ten at or above raw."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    return next((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9)), 10 * mag)


def tick_label(v: float, step: float) -> str:
    """`0.05`, `2.5`, `250`, `25k`, `1.2M`: as many decimals as the step needs, k/M/G once the step reaches them."""
    div, suffix = next(((d, s) for d, s in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if step >= d), (1.0, ""))
    scaled = step / div
    decimals = max(0, math.ceil(-math.log10(scaled) - 1e-9))
    if abs(scaled * 10 ** decimals - round(scaled * 10 ** decimals)) > 1e-6:
        decimals += 1   # a 2.5 step
    text = f"{v / div:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if float(text) == 0 else text + suffix


def _tick_rows(axis: Axis, rows: int) -> dict[int, str]:
    """Row (0 at the top) -> label of the tick drawn there; the first tick to claim a row keeps it."""
    out: dict[int, str] = {}
    units = axis.to_unit(np.array(axis.ticks, dtype=np.float64))
    for u, label in zip(units, axis.labels):
        r = rows - 1 - int(round(float(u) * (rows - 1)))
        if 0 <= r < rows:
            out.setdefault(r, label)
    return out


def _x_rows(axis: Axis, cols: int, lw: int, right: bool, width: int, base: Style) -> list[Strip]:
    """The x axis line with a ┬ under each tick and the tick labels, none overlapping."""
    line = ["─"] * cols
    labels = [" "] * width
    last_end = -1
    units = axis.to_unit(np.array(axis.ticks, dtype=np.float64))
    for u, label in zip(units, axis.labels):
        c = int(round(float(u) * (cols - 1)))
        if not 0 <= c < cols:
            continue
        line[c] = "┬"
        at = min(max(0, lw + 1 + c - len(label) // 2), width - len(label))
        if at > last_end and at >= 0:
            labels[at:at + len(label)] = label
            last_end = at + len(label)
    axis_line = " " * lw + "└" + "".join(line) + ("┘" if right else "")
    return [Strip([Segment(axis_line, base)], len(axis_line)).adjust_cell_length(width, base),
            Strip([Segment("".join(labels), base)], width)]


def _dots(u: np.ndarray, v: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Braille bits per cell of the polyline through (u, v) in 0..1 (points with NaN break it)."""
    ok = np.isfinite(u) & np.isfinite(v)
    dc = np.clip(np.rint(u * (2 * cols - 1)), 0, 2 * cols - 1)
    dr = np.clip(np.rint((1 - v) * (4 * rows - 1)), 0, 4 * rows - 1)
    c0, r0 = dc[:-1], dr[:-1]
    dcol, drow = dc[1:] - c0, dr[1:] - r0
    seg = ok[:-1] & ok[1:]
    c0, r0, dcol, drow = c0[seg], r0[seg], dcol[seg], drow[seg]
    n = np.maximum(np.maximum(np.abs(dcol), np.abs(drow)), 1).astype(np.int64)
    starts = np.repeat(np.cumsum(n) - n, n)
    which = np.repeat(np.arange(len(n)), n)
    t = (np.arange(int(n.sum())) - starts) / n[which]
    cc = np.concatenate([c0[which] + np.rint(dcol[which] * t), dc[ok]]).astype(np.int64)
    rr = np.concatenate([r0[which] + np.rint(drow[which] * t), dr[ok]]).astype(np.int64)
    bits = np.zeros((rows, cols), dtype=np.uint8)
    np.bitwise_or.at(bits, (rr // 4, cc // 2), DOT_BITS[rr % 4, cc % 2])
    return bits


def _runs(owner: np.ndarray) -> list[list[tuple[int, int]]]:
    """Per plot row, its runs as (owner, end column): a run ends where the next line's dots begin. A
    blank cell (owner -1) joins the run before it, as a space looks the same in any foreground colour;
    only the blanks that start a row keep the base style. So a row is a few segments, not one per
    stretch of dots and gap between them."""
    rows, cols = owner.shape
    at = np.where(owner >= 0, np.arange(cols), 0)
    np.maximum.accumulate(at, axis=1, out=at)
    filled = np.take_along_axis(owner, at, axis=1)
    rr, cc = np.nonzero(filled[:, 1:] != filled[:, :-1])
    out: list[list[tuple[int, int]]] = [[] for _ in range(rows)]
    for r, who, end in zip(rr.tolist(), filled[rr, cc].tolist(), (cc + 1).tolist()):
        out[r].append((who, end))
    for row, who in zip(out, filled[:, -1].tolist()):
        row.append((who, cols))
    return out


def _cells(text: str, runs: list[tuple[int, int]], styles: list[Style], base: Style) -> list[Segment]:
    """One plot row as segments, one per run of cells (-1: the base style)."""
    segs, x = [], 0
    for who, end in runs:
        segs.append(Segment(text[x:end], styles[who] if who >= 0 else base))
        x = end
    return segs

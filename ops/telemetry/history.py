"""Fixed-size histories of numeric series and min/max decimation for charts.

Every series keeps a min/max pyramid next to its ring buffer (see MinMaxPyramid),
so `Series.window(width)` / `History.window(key, width)` cost O(width), not
O(points): a chart frame of a 10M-point series reads about as many values as
one of 10K points.
"""

from __future__ import annotations

import threading
from typing import Generic, Hashable, Iterable, Literal, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)
Side = Literal["left", "right"]
"""Which end of a run of equal x a search lands on (numpy's searchsorted)."""

FANOUT = 8
"""Blocks of one pyramid level each cover FANOUT blocks of the level below."""
RAW_RANGE = 4096
"""Ranges this short are scanned point by point (one vectorised call beats the walk)."""
ROLLUP_EVERY = 4096
"""Appends pending before the pyramid catches up (queries catch up first anyway)."""


class _Level:
    """Min/max (and where they are) of blocks of `size` consecutive points, in a ring."""

    def __init__(self, size: int, capacity: int):
        self.size = size
        self.slots = -(-capacity // size) + 1
        self.lo = np.empty(self.slots, dtype=np.float64)
        self.hi = np.empty(self.slots, dtype=np.float64)
        self.ilo = np.empty(self.slots, dtype=np.int64)  # absolute point index of the block's min
        self.ihi = np.empty(self.slots, dtype=np.int64)
        self.x0 = np.empty(self.slots, dtype=np.float64)  # x of each block's first point
        self.done = 0  # blocks 0..done-1 are rolled up (older ones may have fallen off)


class MinMaxPyramid:
    """Min/max pyramid over a ring of points with absolute indexes.

    Level k holds, for every complete block of FANOUT**k points, its min and max
    and their point indexes. Points are rolled up lazily in vectorised batches,
    once per FANOUT points per level: O(1) amortised per append. NaN values
    never win a block (they count as +inf for min and -inf for max).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.levels: list[_Level] = []
        size = FANOUT
        while size <= capacity:
            self.levels.append(_Level(size, capacity))
            size *= FANOUT

    def reset(self) -> None:
        for lv in self.levels:
            lv.done = 0

    def catch_up(self, xs: np.ndarray, ys: np.ndarray, n: int) -> None:
        """Roll up every block complete among the n points appended so far (xs, ys: the rings)."""
        oldest = max(0, n - self.capacity)
        below: _Level | None = None
        for lv in self.levels:
            target = n // lv.size
            first = max(lv.done, -(-oldest // lv.size))  # blocks fully still in the ring
            if first >= target:
                lv.done = max(lv.done, target)
                below = lv
                continue
            rows = np.arange(target - first)
            if below is None:  # from the points
                v = _ring_slice(ys, first * FANOUT, target * FANOUT).reshape(-1, FANOUT)
                nan = np.isnan(v)
                vlo, vhi = (v, v) if not nan.any() else (np.where(nan, np.inf, v), np.where(nan, -np.inf, v))
                alo, ahi = vlo.argmin(axis=1), vhi.argmax(axis=1)
                base = (first + rows) * FANOUT
                at_lo, at_hi = base + alo, base + ahi
                x0 = _ring_slice(xs, first * FANOUT, target * FANOUT)[::FANOUT]
            else:  # from the level below
                def grid(buf):
                    return _ring_slice(buf, first * FANOUT, target * FANOUT).reshape(-1, FANOUT)

                vlo, vhi = grid(below.lo), grid(below.hi)
                alo, ahi = vlo.argmin(axis=1), vhi.argmax(axis=1)
                at_lo, at_hi = grid(below.ilo)[rows, alo], grid(below.ihi)[rows, ahi]
                x0 = grid(below.x0)[:, 0]
            slot = np.arange(first, target, dtype=np.int64) % lv.slots
            lv.lo[slot], lv.hi[slot] = vlo[rows, alo], vhi[rows, ahi]
            lv.ilo[slot], lv.ihi[slot] = at_lo, at_hi
            lv.x0[slot] = x0
            lv.done = target
            below = lv

    def _points(self, ys: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(lo, hi, ilo, ihi) of single points a..b-1 (NaN as +-inf)."""
        idx = np.arange(a, b, dtype=np.int64)
        v = _ring_slice(ys, a, b)
        nan = np.isnan(v)
        if not nan.any():
            return v, v, idx, idx
        return np.where(nan, np.inf, v), np.where(nan, -np.inf, v), idx, idx

    def _blocks(self, lv: _Level, j0: int, j1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (_ring_slice(lv.lo, j0, j1), _ring_slice(lv.hi, j0, j1),
                _ring_slice(lv.ilo, j0, j1), _ring_slice(lv.ihi, j0, j1))

    def range_extremes(self, ys: np.ndarray, a: int, b: int) -> tuple[int, int] | None:
        """Absolute indexes of the min and max of points a..b-1 (None if all NaN or empty).

        Whole blocks of the coarsest level that fits, then the two ragged ends one
        level finer each: O(FANOUT * levels) values read.
        """
        best_lo, best_hi, at_lo, at_hi = np.inf, -np.inf, -1, -1
        for lo, hi, ilo, ihi in self._cover(ys, a, b):
            i, j = int(lo.argmin()), int(hi.argmax())
            if lo[i] < best_lo or at_lo < 0:
                best_lo, at_lo = lo[i], int(ilo[i])
            if hi[j] > best_hi or at_hi < 0:
                best_hi, at_hi = hi[j], int(ihi[j])
        if at_lo < 0 or best_lo == np.inf:
            return None  # empty, or every value NaN
        return at_lo, at_hi

    def _cover(self, ys, a: int, b: int, top: int | None = None) -> list:
        """Pieces (lo, hi, ilo, ihi) covering a..b-1 exactly, coarse in the middle."""
        if a >= b:
            return []
        if b - a <= RAW_RANGE:  # fewer numpy calls than walking down the levels
            return [self._points(ys, a, b)]
        top = len(self.levels) if top is None else top
        for k in range(top - 1, -1, -1):
            lv = self.levels[k]
            j0 = -(-a // lv.size)
            j1 = min(b // lv.size, lv.done)
            if j1 > j0:
                return [
                    *self._cover(ys, a, j0 * lv.size, k),
                    self._blocks(lv, j0, j1),
                    *self._cover(ys, j1 * lv.size, b, k),
                ]
        return [self._points(ys, a, b)]

    def level_for(self, a: int, b: int, width: int) -> _Level | None:
        """The coarsest level with at least two complete blocks per bucket in a..b-1 (None: points)."""
        level = None
        for lv in self.levels:
            if (min(b, lv.done * lv.size) - a) // lv.size >= 2 * width:
                level = lv
        return level

    def bucket_edges(self, xs: np.ndarray, a: int, b: int, bounds: np.ndarray) -> np.ndarray:
        """Absolute index edges a, ..., b of buckets split at x values `bounds` (increasing).

        Searches the x of block starts of the level buckets() will use (a few
        thousand values, in cache) rather than every point.
        """
        level = self.level_for(a, b, bounds.size + 1)
        if level is None:
            pos = a + np.searchsorted(_ring_slice(xs, a, b), bounds, side="left")
        else:
            j0, j1 = -(-a // level.size), min(b // level.size, level.done)
            pos = (j0 + np.searchsorted(_ring_slice(level.x0, j0, j1), bounds, side="left")) * level.size
        return np.r_[a, np.clip(pos, a, b), b]

    def buckets(self, ys: np.ndarray, a: int, b: int, edges: np.ndarray) -> np.ndarray:
        """Absolute indexes of the min and max of each bucket of points a..b-1, sorted, unique.

        edges: increasing absolute indexes a = e0 <= ... <= em = b. They are snapped to
        the blocks of the coarsest level with at least two blocks per bucket on
        average; every point still lies in exactly one bucket and each bucket's
        min and max are exact (the ragged ends' own extremes join the first and last
        bucket: at most 2*buckets + 4 points). Cost: O(len(edges) + FANOUT * levels).
        """
        level = self.level_for(a, b, max(1, edges.size - 1))
        if level is None:  # few points: bucket them one by one
            lo, hi, ilo, ihi = self._points(ys, a, b)
            starts = _distinct(np.clip(edges[:-1], a, b - 1)) - a
            return _segment_extremes(lo, hi, ilo, ihi, starts)
        size = level.size
        j0, j1 = -(-a // size), min(b // size, level.done)
        blk = _distinct(np.clip(-(-edges[:-1] // size), j0, j1 - 1))  # first block of each bucket
        lo, hi, ilo, ihi = self._blocks(level, j0, j1)
        picked = [_segment_extremes(lo, hi, ilo, ihi, blk - j0)]
        for ends in ((a, j0 * size), (j1 * size, b)):  # the ragged ends: their extremes join the edge buckets
            ext = self.range_extremes(ys, *ends)
            if ext is not None:
                picked.append(np.array(ext, dtype=np.int64))
        return _distinct(np.sort(np.concatenate(picked)))


def _ring_slice(buf: np.ndarray, a: int, b: int) -> np.ndarray:
    """Items a..b-1 of a ring indexed modulo its length: a view unless the range wraps."""
    n = buf.size
    i, j = a % n, a % n + (b - a)
    return buf[i:j] if j <= n else np.concatenate((buf[i:], buf[: j - n]))


def _distinct(sorted_values: np.ndarray) -> np.ndarray:
    """The distinct values of a sorted array (np.unique without its sort or hashing)."""
    if sorted_values.size < 2:
        return sorted_values
    return sorted_values[np.r_[True, sorted_values[1:] != sorted_values[:-1]]]


def _segment_extremes(lo, hi, ilo, ihi, starts: np.ndarray) -> np.ndarray:
    """Point indexes of each segment's min and max (segments start at `starts`)."""
    n = lo.size
    mins = np.minimum.reduceat(lo, starts)
    maxs = np.maximum.reduceat(hi, starts)
    seg = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, n]))
    pos = np.arange(n)
    first_lo = np.minimum.reduceat(np.where(lo == mins[seg], pos, n), starts)
    first_hi = np.minimum.reduceat(np.where(hi == maxs[seg], pos, n), starts)
    keep_lo, keep_hi = mins != np.inf, maxs != -np.inf  # otherwise the segment was all NaN
    return _distinct(np.sort(np.concatenate((ilo[first_lo[keep_lo]], ihi[first_hi[keep_hi]]))))


class Series:
    """A ring buffer of (x, y) points with a min/max pyramid; the oldest points fall off when full."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self._start = 0
        self._len = 0
        self._n = 0  # points ever appended since the last clear: point i lives at i % capacity
        self._sorted = True  # x never went down (window() can binary-search it)
        self._pyramid = MinMaxPyramid(capacity)

    def __len__(self) -> int:
        return self._len

    def append(self, x: float, y: float) -> None:
        i = (self._start + self._len) % self.capacity
        if self._len and x < self._x[(i - 1) % self.capacity]:
            self._sorted = False
        self._x[i] = x
        self._y[i] = y
        self._n += 1
        if self._len < self.capacity:
            self._len += 1
        else:
            self._start = (self._start + 1) % self.capacity
        if self._n % ROLLUP_EVERY == 0:
            self._pyramid.catch_up(self._x, self._y, self._n)

    def extend(self, xs, ys) -> None:
        """Append many points at once (vectorised)."""
        xs = np.asarray(xs, dtype=np.float64).ravel()
        ys = np.asarray(ys, dtype=np.float64).ravel()
        if xs.shape != ys.shape:
            raise ValueError("xs and ys must have the same length")
        if xs.size == 0:
            return
        last = self.last()
        if (last is not None and xs[0] < last[0]) or np.any(xs[1:] < xs[:-1]):
            self._sorted = False
        if xs.size > self.capacity:
            xs, ys, skipped = xs[-self.capacity :], ys[-self.capacity :], xs.size - self.capacity
            self._n += skipped  # points that would fall off at once
            self._start = (self._start + skipped) % self.capacity if self._len == self.capacity else self._start
        slots = (self._n + np.arange(xs.size)) % self.capacity
        self._x[slots], self._y[slots] = xs, ys
        self._n += xs.size
        self._len = min(self.capacity, self._len + xs.size)
        self._start = (self._n - self._len) % self.capacity
        self._pyramid.catch_up(self._x, self._y, self._n)

    def clear(self) -> None:
        self._start = 0
        self._len = 0
        self._n = 0
        self._sorted = True
        self._pyramid.reset()

    def window(self, width: int, t0: float | None = None, t1: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The points with t0 <= x <= t1, min/max-decimated to about 2*width points for a chart.

        The x range is cut into `width` equal buckets (snapped to pyramid blocks);
        each bucket keeps its lowest and highest point, so spikes and dips survive
        exactly. NaN values are dropped. Cost O(width) via the pyramid while x
        never decreased; otherwise falls back to decimate() (O(points)).
        """
        if width < 1:
            raise ValueError("width must be >= 1")
        if not self._len:
            return np.empty(0), np.empty(0)
        if not self._sorted:
            xs, ys = self.xs(), self.ys()
            keep = np.ones(xs.size, dtype=bool)
            if t0 is not None:
                keep &= xs >= t0
            if t1 is not None:
                keep &= xs <= t1
            return decimate(xs[keep], ys[keep], width)
        a, b = self._n - self._len, self._n
        if t0 is not None:
            a = self._search(t0, "left")
        if t1 is not None:
            b = self._search(t1, "right")
        if a >= b:
            return np.empty(0), np.empty(0)
        self._pyramid.catch_up(self._x, self._y, self._n)
        if b - a <= 2 * width:
            idx = np.arange(a, b) % self.capacity
            keep = ~np.isnan(self._y[idx])
            return self._x[idx[keep]], self._y[idx[keep]]
        x0, x1 = self._x[a % self.capacity], self._x[(b - 1) % self.capacity]
        bounds = np.linspace(x0, x1, width + 1)[1:-1]
        edges = self._pyramid.bucket_edges(self._x, a, b, bounds)
        idx = self._pyramid.buckets(self._y, a, b, edges) % self.capacity
        return self._x[idx], self._y[idx]

    def _search(self, x: float, side: Side) -> int:
        return int(self._search_many(np.array([x], dtype=np.float64), side)[0])

    def _search_many(self, xs: np.ndarray, side: Side = "left") -> np.ndarray:
        """Absolute indexes where xs would go among the (sorted) points of the ring."""
        first = self._n - self._len
        p0 = first % self.capacity
        head = self._x[p0 : p0 + self._len]  # up to the physical end
        tail = self._x[: max(0, p0 + self._len - self.capacity)]  # wrapped part
        pos = np.searchsorted(head, xs, side=side)
        if tail.size:
            in_tail = pos >= head.size
            pos = np.where(in_tail, head.size + np.searchsorted(tail, xs, side=side), pos)
        return first + pos

    def _ordered(self, buf: np.ndarray) -> np.ndarray:
        end = self._start + self._len
        if end <= self.capacity:
            return buf[self._start:end].copy()
        return np.concatenate((buf[self._start:], buf[: end - self.capacity]))

    def xs(self) -> np.ndarray:
        """The x values, oldest first (a copy)."""
        return self._ordered(self._x)

    def ys(self) -> np.ndarray:
        """The y values, oldest first (a copy)."""
        return self._ordered(self._y)

    def last(self) -> tuple[float, float] | None:
        if not self._len:
            return None
        i = (self._start + self._len - 1) % self.capacity
        return float(self._x[i]), float(self._y[i])


class History(Generic[K]):
    """Series by key (a node's keys are ops.telemetry.series), safe across threads."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._series: dict[K, Series] = {}
        self._lock = threading.Lock()

    def append(self, key: K, x: float, y: float | None) -> None:
        """Add a point; None values (not reported) are skipped, not drawn as 0."""
        if y is None:
            return
        with self._lock:
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = Series(self.capacity)
            s.append(float(x), float(y))

    def window(self, key: K, width: int, t0: float | None = None, t1: float | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """A series' points with t0 <= x <= t1, min/max-decimated for a `width`-column chart.

        About 2*width points, in x order; costs O(width), not O(points) (see Series.window).
        Empty arrays when the series has no points.
        """
        with self._lock:
            s = self._series.get(key)
            if s is None:
                return np.empty(0), np.empty(0)
            return s.window(width, t0, t1)

    def length(self, key: K) -> int:
        """Points held for a series (0 when it has none)."""
        with self._lock:
            s = self._series.get(key)
            return 0 if s is None else len(s)

    def get(self, key: K) -> tuple[np.ndarray, np.ndarray]:
        """(xs, ys) of a series; empty arrays when it has no points."""
        with self._lock:
            s = self._series.get(key)
            if s is None:
                return np.empty(0), np.empty(0)
            return s.xs(), s.ys()

    def keys(self) -> list[K]:
        """The keys of the series held, oldest first."""
        with self._lock:
            return list(self._series)

    def drop(self, keys: Iterable[K]) -> None:
        """Forget these series."""
        with self._lock:
            for k in keys:
                self._series.pop(k, None)


def decimate(xs, ys, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Reduce a series to at most 2*width points, keeping each bucket's min and max.

    The x range is cut into `width` equal buckets; each non-empty bucket keeps
    its lowest and highest point in x order, so spikes and dips survive exactly.
    Points with NaN y are dropped. xs need not be sorted.
    """
    xs = np.asarray(xs, dtype=np.float64)
    ys = np.asarray(ys, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError("xs and ys must be 1-D arrays of the same length")
    if width < 1:
        raise ValueError("width must be >= 1")
    keep = ~(np.isnan(ys) | np.isnan(xs))
    if not keep.all():
        xs, ys = xs[keep], ys[keep]
    if xs.size > 1 and np.any(xs[1:] < xs[:-1]):
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
    n = xs.size
    if n <= 2 * width:
        return xs, ys
    x0, x1 = xs[0], xs[-1]
    if x1 == x0:
        bucket = np.zeros(n, dtype=np.int64)
    else:
        bucket = np.minimum(((xs - x0) * (width / (x1 - x0))).astype(np.int64), width - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    idx = np.arange(n)
    mins = np.minimum.reduceat(ys, starts)
    maxs = np.maximum.reduceat(ys, starts)
    seg = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, n]))
    i_min = np.minimum.reduceat(np.where(ys == mins[seg], idx, n), starts)
    i_max = np.minimum.reduceat(np.where(ys == maxs[seg], idx, n), starts)
    picked = np.unique(np.concatenate((i_min, i_max)))
    return xs[picked], ys[picked]

"""Fixed-size histories of numeric series and min/max decimation for charts."""

from __future__ import annotations

import threading

import numpy as np


class Series:
    """A ring buffer of (x, y) points; the oldest points fall off when full."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self._start = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, x: float, y: float) -> None:
        i = (self._start + self._len) % self.capacity
        self._x[i] = x
        self._y[i] = y
        if self._len < self.capacity:
            self._len += 1
        else:
            self._start = (self._start + 1) % self.capacity

    def clear(self) -> None:
        self._start = 0
        self._len = 0

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


class History:
    """Named series (e.g. "gpu0.util", "inference.accept_len"), safe across threads."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._series: dict[str, Series] = {}
        self._lock = threading.Lock()

    def append(self, name: str, x: float, y: float | None) -> None:
        """Add a point; None values (not reported) are skipped, not drawn as 0."""
        if y is None:
            return
        with self._lock:
            s = self._series.get(name)
            if s is None:
                s = self._series[name] = Series(self.capacity)
            s.append(float(x), float(y))

    def get(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(xs, ys) of a series; empty arrays when it has no points."""
        with self._lock:
            s = self._series.get(name)
            if s is None:
                return np.empty(0), np.empty(0)
            return s.xs(), s.ys()

    def names(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(n for n in self._series if n.startswith(prefix))

    def clear(self, prefix: str = "") -> None:
        """Drop every series whose name starts with prefix."""
        with self._lock:
            for n in [n for n in self._series if n.startswith(prefix)]:
                del self._series[n]


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

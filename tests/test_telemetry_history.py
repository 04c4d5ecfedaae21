"""Ring-buffer histories and min/max decimation."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.telemetry.history import History, Series, decimate


def test_series_keeps_the_newest_points_in_order():
    s = Series(4)
    assert s.last() is None and len(s) == 0
    for i in range(10):
        s.append(i, i * 10)
    assert len(s) == 4
    assert s.xs().tolist() == [6, 7, 8, 9]
    assert s.ys().tolist() == [60, 70, 80, 90]
    assert s.last() == (9.0, 90.0)
    s.clear()
    assert len(s) == 0 and s.xs().size == 0


def test_series_before_wrapping_and_exactly_full():
    s = Series(3)
    s.append(1, 1)
    assert s.xs().tolist() == [1]
    s.append(2, 2)
    s.append(3, 3)
    assert s.xs().tolist() == [1, 2, 3]
    s.append(4, 4)
    assert s.xs().tolist() == [2, 3, 4]


def test_history_skips_unreported_values_and_clears_by_prefix():
    h = History(capacity=8)
    h.append("gpu0.util", 1, 50)
    h.append("gpu0.util", 2, None)
    h.append("gpu1.util", 1, 70)
    h.append("training:/a:loss", 1, 2.5)
    xs, ys = h.get("gpu0.util")
    assert xs.tolist() == [1] and ys.tolist() == [50]
    assert h.names("gpu") == ["gpu0.util", "gpu1.util"]
    h.clear("training:/a:")
    assert h.names() == ["gpu0.util", "gpu1.util"]
    assert h.get("missing")[0].size == 0


def test_history_is_safe_across_threads():
    h = History(capacity=100_000)

    def writer(k):
        for i in range(5000):
            h.append(f"s{k}", i, i)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(h.get(f"s{k}")[0]) == 5000 for k in range(4))


def _bucket_extrema(xs, ys, width, x0, x1):
    """min and max y per bucket of [x0, x1] cut into width equal parts."""
    b = np.minimum(((xs - x0) * (width / (x1 - x0))).astype(np.int64), width - 1) if x1 > x0 else np.zeros(len(xs), int)
    return {int(k): (ys[b == k].min(), ys[b == k].max()) for k in np.unique(b)}


@settings(max_examples=150, deadline=None)
@given(
    ys=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=600),
    width=st.integers(1, 80),
    shuffled=st.booleans(),
)
def test_decimation_keeps_every_bucket_min_and_max_exactly(ys, width, shuffled):
    ys = np.array(ys)
    xs = np.arange(len(ys), dtype=float)
    if shuffled:
        perm = np.random.default_rng(len(ys)).permutation(len(ys))
        xs, ys = xs[perm], ys[perm]
    dx, dy = decimate(xs, ys, width)
    assert len(dx) <= max(2 * width, len(xs))
    assert np.all(np.diff(dx) >= 0)  # x order for drawing
    pairs = set(zip(xs.tolist(), ys.tolist()))
    assert set(zip(dx.tolist(), dy.tolist())) <= pairs  # only real points
    assert dy.max() == ys.max() and dy.min() == ys.min()
    if len(xs) > 2 * width:
        x0, x1 = xs.min(), xs.max()
        assert _bucket_extrema(dx, dy, width, x0, x1) == _bucket_extrema(xs, ys, width, x0, x1)
    else:
        assert len(dx) == len(xs)


def test_decimating_a_million_points_keeps_spikes():
    rng = np.random.default_rng(0)
    xs = np.arange(1_000_000, dtype=float)
    ys = rng.normal(0, 1, xs.size)
    ys[123_457] = 99.0
    ys[876_543] = -77.0
    dx, dy = decimate(xs, ys, 200)
    assert len(dx) <= 400
    assert 99.0 in dy and -77.0 in dy
    assert dx[dy.argmax()] == 123_457 and dx[dy.argmin()] == 876_543


def test_decimate_drops_nan_and_rejects_bad_input():
    dx, dy = decimate([0, 1, 2], [1.0, float("nan"), 3.0], 10)
    assert dx.tolist() == [0, 2] and dy.tolist() == [1, 3]
    with pytest.raises(ValueError):
        decimate([1, 2], [1], 10)
    with pytest.raises(ValueError):
        decimate([1, 2], [1, 2], 0)
    dx, dy = decimate(np.full(100, 5.0), np.arange(100.0), 3)  # all x equal: one bucket
    assert dy.tolist() == [0.0, 99.0]

"""Ring-buffer histories and min/max decimation."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.telemetry.history import History, Series, decimate
from ops.telemetry.series import GpuField, GpuKey, SeriesKey, TrainingKey


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


def test_history_skips_unreported_values_and_drops_series():
    h: History[SeriesKey] = History(capacity=8)
    h.append(GpuKey(0), 1, 50)
    h.append(GpuKey(0), 2, None)
    h.append(GpuKey(1), 1, 70)
    h.append(TrainingKey("/a", "loss"), 1, 2.5)
    xs, ys = h.get(GpuKey(0, GpuField.UTIL))   # the same key, however it is spelt
    assert xs.tolist() == [1] and ys.tolist() == [50]
    assert h.keys() == [GpuKey(0), GpuKey(1), TrainingKey("/a", "loss")]
    h.drop([TrainingKey("/a", "loss"), TrainingKey("/a", "never there")])
    assert h.keys() == [GpuKey(0), GpuKey(1)]
    assert h.get(GpuKey(0, GpuField.TEMP_C))[0].size == 0


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


# -- the min/max pyramid behind Series.window ----------------------------------------------------
from ops.telemetry import history as history_mod  # noqa: E402


@settings(max_examples=120, deadline=None)
@given(
    capacity=st.integers(1, 700),
    extra=st.integers(0, 900),
    nan_every=st.integers(0, 7),
    seed=st.integers(0, 2**16),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    bulk=st.booleans(),
)
def test_pyramid_range_extremes_match_brute_force(capacity, extra, nan_every, seed, cut, bulk):
    """Every level walked (no point-scan shortcut), across ring wrap-around, with NaN holes."""
    rng = np.random.default_rng(seed)
    n = capacity + extra
    ys = rng.integers(-50, 50, n).astype(float)  # ties on purpose: the first of equals wins
    if nan_every:
        ys[::nan_every + 1] = np.nan
    s = Series(capacity)
    if bulk:
        s.extend(np.arange(n, dtype=float), ys)
    else:
        for i, y in enumerate(ys):
            s.append(float(i), float(y))
    first = n - len(s)
    a = first + int(cut[0] * len(s))
    b = a + int(cut[1] * (n - a)) + 1
    b = min(b, n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(history_mod, "RAW_RANGE", 0)
        s._pyramid.catch_up(s._x, s._y, s._n)
        got = s._pyramid.range_extremes(s._y, a, b)
    seg = ys[a:b]
    if np.isnan(seg).all():
        assert got is None
    else:
        assert got is not None
        assert ys[got[0]] == np.nanmin(seg) and ys[got[1]] == np.nanmax(seg)
        assert a <= got[0] < b and a <= got[1] < b


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 5000),
    capacity=st.integers(1, 3000),
    width=st.integers(1, 60),
    seed=st.integers(0, 2**16),
    window=st.one_of(st.none(), st.tuples(st.floats(0, 1), st.floats(0, 1))),
)
def test_window_returns_real_points_with_every_extreme(n, capacity, width, seed, window):
    rng = np.random.default_rng(seed)
    xs = np.cumsum(rng.integers(1, 4, n)).astype(float)  # increasing, uneven steps
    ys = rng.normal(0, 1, n)
    s = Series(capacity)
    s.extend(xs, ys)
    kept_x, kept_y = xs[-capacity:], ys[-capacity:]
    t0 = t1 = None
    if window is not None:
        lo, hi = sorted(window)
        t0 = kept_x[0] + lo * (kept_x[-1] - kept_x[0])
        t1 = kept_x[0] + hi * (kept_x[-1] - kept_x[0])
        inside = (kept_x >= t0) & (kept_x <= t1)
        kept_x, kept_y = kept_x[inside], kept_y[inside]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(history_mod, "RAW_RANGE", 0)
        dx, dy = s.window(width, t0, t1)
    assert len(dx) <= max(2 * width + 4, 0) or len(dx) == len(kept_x)
    assert np.all(np.diff(dx) > 0)
    assert set(zip(dx.tolist(), dy.tolist())) <= set(zip(kept_x.tolist(), kept_y.tolist()))
    if kept_x.size:
        assert dy.max() == kept_y.max() and dy.min() == kept_y.min()
    else:
        assert dx.size == 0
    if kept_x.size <= 2 * width:
        assert dx.tolist() == kept_x.tolist()


def test_window_matches_decimate_when_buckets_align_with_blocks():
    rng = np.random.default_rng(1)
    width, per_bucket = 50, 64  # buckets of 64 points = 8 blocks of 8
    n = width * per_bucket
    xs, ys = np.arange(n, dtype=float), rng.normal(0, 1, n)
    s = Series(n)
    for x, y in zip(xs, ys):  # one by one, as telemetry arrives
        s.append(x, y)
    edges = np.arange(0, n + 1, per_bucket)
    got = s._pyramid.buckets(s._y, 0, n, edges)
    want = []
    for k in range(width):
        seg = ys[edges[k] : edges[k + 1]]
        want += [edges[k] + seg.argmin(), edges[k] + seg.argmax()]
    assert got.tolist() == sorted(set(want))


def test_spikes_survive_in_two_million_points():
    rng = np.random.default_rng(0)
    n = 2_000_000
    ys = rng.normal(0, 1, n)
    spikes = {123_457: 99.0, 1_000_001: -77.0, 1_999_998: 55.0, 7: -66.0}
    for i, v in spikes.items():
        ys[i] = v
    s = Series(n)
    s.extend(np.arange(n, dtype=float), ys)
    dx, dy = s.window(200)
    assert len(dx) <= 2 * 200 + 4
    for i, v in spikes.items():
        assert dy[dx == i].tolist() == [v]
    zx, zy = s.window(100, t0=1_000_000, t1=1_000_010)  # a zoom: every point there
    assert zx.tolist() == list(range(1_000_000, 1_000_011)) and -77.0 in zy


def test_window_falls_back_when_x_went_down_and_history_window_api():
    s = Series(100)
    for x in [5, 6, 7, 1, 2, 3]:
        s.append(x, x * 10)
    assert s.window(1, t0=2, t1=6)[0].tolist() == [2.0, 6.0]  # decimate() over what is in range
    h = History(capacity=1000)
    for i in range(1000):
        h.append("gpu0.util", i, i % 100)
    h.append("gpu0.util", 1000, float("nan"))
    xs, ys = h.window("gpu0.util", 10)
    assert 0.0 in ys and 99.0 in ys and not np.isnan(ys).any() and len(xs) <= 24
    assert h.window("missing", 10)[0].size == 0
    s.clear()
    assert s.window(5)[0].size == 0
    s.append(1, 1)
    assert s.window(5)[1].tolist() == [1.0]
    with pytest.raises(ValueError):
        s.window(0)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 300),
    chunks=st.lists(st.integers(0, 400), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_appends_and_bulk_extends_mix_like_one_ring(capacity, chunks, seed):
    rng = np.random.default_rng(seed)
    s = Series(capacity)
    all_y: list[float] = []
    for k, size in enumerate(chunks):
        ys = rng.normal(0, 1, size)
        xs = np.arange(len(all_y), len(all_y) + size, dtype=float)
        if k % 2:
            for x, y in zip(xs, ys):
                s.append(x, y)
        else:
            s.extend(xs, ys)
        all_y += ys.tolist()
    want = np.array(all_y[-capacity:])
    assert s.ys().tolist() == want.tolist() and len(s) == want.size
    if want.size:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(history_mod, "RAW_RANGE", 0)
            s._pyramid.catch_up(s._x, s._y, s._n)
            lo, hi = s._pyramid.range_extremes(s._y, s._n - len(s), s._n)
        assert s._y[lo % capacity] == want.min() and s._y[hi % capacity] == want.max()

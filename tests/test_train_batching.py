"""Bucketed batching: interleave properties (hypothesis), determinism, exact mid-epoch resume, sharding."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.errors import UserError
from trainer.batching import BucketBatchSampler, collate, finish_slack, interleave, run_cap


def max_run(order):
    best = cur = 0
    prev = object()
    for x in order:
        cur = cur + 1 if x == prev else 1
        prev = x
        best = max(best, cur)
    return best


bucket_sizes = st.lists(
    st.one_of(st.integers(1, 12), st.integers(13, 400), st.sampled_from([1000, 3000])), min_size=1, max_size=9
)


@settings(max_examples=300, deadline=None)
@given(counts=bucket_sizes, seed=st.integers(0, 2**32 - 1))
def test_interleave_properties(counts, seed):
    order = interleave(counts, random.Random(seed))
    n, m = sum(counts), max(counts)
    rest = n - m
    # every batch exactly once
    assert sorted(order) == sorted(b for b, c in enumerate(counts) for _ in range(c))
    # runs: <= 3 whenever any schedule can do it, else the least possible cap
    cap = run_cap(counts)
    assert max_run(order) <= cap
    if m <= 3 * (rest + 1):
        assert cap == 3
    else:
        assert cap == math.ceil(m / (rest + 1)) > 3
    # all buckets finish together: fewer than one stride (+ one slot per bucket) after each last batch
    g = finish_slack(counts)
    for b, c in enumerate(counts):
        last = max(i for i, x in enumerate(order) if x == b)
        assert n - 1 - last < n / c + len(counts) * g


def test_pathological_bucket_gets_the_optimal_cap():
    counts = [1000, 1, 2]  # 1000 batches, 3 separators: no schedule beats ceil(1000 / 4) = 250
    order = interleave(counts, random.Random(0))
    assert run_cap(counts) == 250 and max_run(order) == 250
    # the three others are spread out, not bunched at one end
    positions = [i for i, b in enumerate(order) if b != 0]
    assert all(200 < b - a < 300 for a, b in zip(positions, positions[1:]))


def test_interleave_needs_lookahead_for_runs_of_three():
    # 9 vs 2: plain earliest-due gives a run of 5 here; AAA B AAA B AAA is the only shape that works
    for seed in range(50):
        assert max_run(interleave([9, 2], random.Random(seed))) == 3


def lengths_for(n=97, seed=1):
    rng = random.Random(seed)
    return [rng.choice([rng.randint(5, 40), rng.randint(100, 400), rng.randint(1000, 2000)]) for _ in range(n)]


@pytest.mark.parametrize("kwargs", [{"batch_size": 4}, {"batch_tokens": 2048}])
def test_epoch_uses_every_sample_once_in_length_buckets(kwargs):
    lengths = lengths_for()
    s = BucketBatchSampler(lengths, num_buckets=4, seed=3, **kwargs)
    batches = list(s)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    bucket_of = {i: k for k, bucket in enumerate(s.buckets) for i in bucket}
    assert all(len({bucket_of[i] for i in b}) == 1 for b in batches)
    if "batch_tokens" in kwargs:
        assert all(max(lengths[i] for i in b) * len(b) <= 2048 or len(b) == 1 for b in batches)
    assert max_run([bucket_of[b[0]] for b in batches]) <= run_cap([len(x) for x in s.buckets])
    assert s.state() == {"epoch": 1, "position": 0}


def test_deterministic_under_seed_and_differs_by_epoch_and_seed():
    lengths = lengths_for()
    a = BucketBatchSampler(lengths, batch_size=3, seed=11)
    b = BucketBatchSampler(lengths, batch_size=3, seed=11)
    assert a.epoch_batches(0) == b.epoch_batches(0)
    assert a.epoch_batches(0) != a.epoch_batches(1)
    assert a.epoch_batches(0) != BucketBatchSampler(lengths, batch_size=3, seed=12).epoch_batches(0)


def test_resume_mid_epoch_yields_exact_remaining_sequence():
    lengths = lengths_for()
    full = BucketBatchSampler(lengths, batch_size=5, seed=7)
    expected = list(full) + list(full)  # two epochs
    run = BucketBatchSampler(lengths, batch_size=5, seed=7)
    it = iter(run)
    seen = [next(it) for _ in range(6)]
    state = run.state()
    assert state == {"epoch": 0, "position": 6}
    resumed = BucketBatchSampler(lengths, batch_size=5, seed=7)
    resumed.load_state(state)
    rest = list(resumed) + list(resumed)
    assert seen + rest == expected


def test_ranks_shard_the_epoch():
    lengths = lengths_for(n=50)
    whole = BucketBatchSampler(lengths, batch_size=3, seed=5).epoch_batches(0)
    r0 = BucketBatchSampler(lengths, batch_size=3, seed=5, rank=0, world_size=2).epoch_batches(0)
    r1 = BucketBatchSampler(lengths, batch_size=3, seed=5, rank=1, world_size=2).epoch_batches(0)
    assert len(r0) == len(r1) == math.ceil(len(whole) / 2)
    assert r0 == whole[0::2] and r1 == (whole + whole[:1])[1::2][: len(r0)]
    assert {i for b in r0 + r1 for i in b} == set(range(50))


def test_bad_settings_are_user_errors():
    with pytest.raises(UserError, match="exactly one"):
        BucketBatchSampler([3, 4], batch_size=2, batch_tokens=10)
    with pytest.raises(UserError, match="no training samples"):
        BucketBatchSampler([], batch_size=2)


def test_collate_right_pads():
    import torch

    items = [{"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1], dtype=torch.uint8),
              "aux": torch.ones(3, 2)},
             {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([1], dtype=torch.uint8),
              "aux": torch.ones(1, 2)}]
    b = collate(items, pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert b["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["lengths"].tolist() == [3, 1]
    assert b["aux"][1].tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]

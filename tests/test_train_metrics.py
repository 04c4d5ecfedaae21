"""Accuracy / streak / acceptance-length metrics by hand, and the metrics JSONL writer."""

from __future__ import annotations

import json
import math

import pytest
import torch

from trainer.losses import eagle3_targets
from trainer.metrics import MetricsWriter, Stats, chain_stats, dflash_stats, eagle3_stats, streak, topk_hits

LN2, LN3 = math.log(2), math.log(3)


def test_topk_hits_and_streak():
    logits = torch.tensor([[0.1, 0.5, 0.3, 0.2], [0.1, 0.5, 0.3, 0.2]])
    assert topk_hits(logits, torch.tensor([2, 3]), 2).tolist() == [True, False]
    assert topk_hits(logits, torch.tensor([3, 0]), 8).tolist() == [True, True]  # k clipped to the vocab
    hits = torch.tensor([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert streak(hits).tolist() == [2, 0, 4]


def test_chain_stats_by_hand():
    top1 = torch.tensor([[True, True, False], [False, True, False]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    top4 = torch.tensor([[True, True, True], [True, True, False]])
    m = chain_stats(top1 & valid, {4: top4 & valid}, valid).means()
    assert m["acc_0"] == 0.5 and m["acc_1"] == 1.0 and m["acc_2"] == 0.0
    assert m["streak_top1"] == 1.0          # chains of 2 and 0
    assert m["accept_len"] == 2.0           # 1 + mean streak
    assert m["top4_acc"] == 1.0             # 5 of 5 valid positions within top-4
    assert m["streak_top4"] == 2.5          # 3 and 2 (the second chain ends where it stops being valid)


def test_eagle3_stats_by_hand():
    # target vocab 3, draft {0,1}; positions 1 and 2 are scored (top target token 0 at both)
    target_logits = torch.tensor([[[0.0, 9.0, -5.0], [LN2, 0.0, -5.0], [0.0, 0.0, -5.0], [0.0, 0.0, 7.0]]])
    probs, mask = eagle3_targets(target_logits, torch.tensor([[0, 1, 1, 1]]), torch.tensor([0, 1]),
                                 torch.tensor([True, True, False]))
    step0 = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])  # rows 0,1 predict 0: hits
    step1 = torch.tensor([[[0.0, LN3], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])  # row 0 predicts 1: miss
    m = eagle3_stats([step0, step1], probs, mask).means()
    assert m["acc_0"] == 1.0 and m["acc_1"] == 0.0
    # chains start at rows 0 and 1: row 0 hit then miss -> 1; row 1 hit then unscored -> 1
    assert m["streak_top1"] == 1.0 and m["accept_len"] == 2.0
    # top-4 of a 2-token vocab always holds the label: row 0 gets 2, row 1 gets 1
    assert m["top4_acc"] == 1.0 and m["streak_top4"] == 1.5


def test_dflash_stats_by_hand():
    # two blocks of 4 slots; slot 0 is the anchor (never scored)
    labels = torch.tensor([[[5, 1, 2, 0], [5, 2, 2, 2]]])
    valid = torch.tensor([[[False, True, True, True], [False, True, True, False]]])
    rows = []  # logits of the valid slots in order; vocab 3
    rows.append([0.0, 1.0, 0.0])   # block 0 slot 1: label 1 -> hit
    rows.append([0.0, 0.0, 1.0])   # slot 2: label 2 -> hit
    rows.append([0.0, 1.0, 0.5])   # slot 3: label 0 -> miss (rank 3)
    rows.append([1.0, 0.0, 0.5])   # block 1 slot 1: label 2 -> miss (rank 2)
    rows.append([0.0, 0.0, 3.0])   # slot 2: label 2 -> hit
    m = dflash_stats(torch.tensor(rows), labels, valid).means()
    assert m["acc_0"] == 0.5 and m["acc_1"] == 1.0 and m["acc_2"] == 0.0
    assert m["streak_top1"] == 1.0 and m["accept_len"] == 2.0   # streaks 2 and 0
    assert m["top4_acc"] == 1.0 and m["streak_top4"] == 2.5     # 3 and 2


def test_stats_pool_ratios_over_steps():
    a, b = Stats(), Stats()
    a.add("acc_0", 1, 4)
    b.add("acc_0", 3, 4)
    b.add("empty", 0, 0)
    a.merge(b)
    assert a.means() == {"acc_0": 0.5}
    doubled = a.means(reduce=lambda flat: flat * 2)  # what an all-reduce over 2 equal ranks does
    assert doubled == {"acc_0": 0.5}
    assert a.totals()["acc_0"] == (4.0, 8.0)


def test_metrics_writer_jsonl_and_disabled_backends(tmp_path):
    lines = []
    w = MetricsWriter(tmp_path / "m" / "metrics.jsonl", wandb_project="proj", tensorboard_dir=tmp_path / "tb",
                      log=lines.append)
    for step in (1, 2, 3):
        w.write({"step": step, "epoch": step / 3, "loss": 1.0 / step, "lr": 1e-4, "acc_0": 0.5})
    w.close()
    records = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(isinstance(v, (int, float)) for r in records for v in r.values())
    assert {"ts", "step", "epoch", "loss", "lr", "acc_0"} <= set(records[0])
    try:
        import wandb  # noqa: F401
    except ImportError:
        assert "metrics: wandb is not installed; wandb logging disabled" in lines
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        assert "metrics: tensorboard is not installed; tensorboard logging disabled" in lines
    else:
        assert any((tmp_path / "tb").iterdir())
    w2 = MetricsWriter(tmp_path / "m" / "metrics.jsonl", log=lines.append)
    w2.truncate_after(2)
    assert [json.loads(x)["step"] for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.parametrize("k", [1, 3])
def test_streak_of_all_true_is_length(k):
    assert streak(torch.ones(2, k, dtype=torch.bool)).tolist() == [k, k]

"""Drafter losses and the optimiser schedule against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.losses import (
    dflash_loss,
    dflash_slot_weights,
    eagle3_loss,
    eagle3_targets,
    soft_cross_entropy,
    ttt_weights,
    weighted_cross_entropy,
)
from trainer.optim import WarmupCosine, build_optimizer, build_scheduler, clip_gradients, warmup_steps_for

LN2, LN3 = math.log(2), math.log(3)


def test_soft_cross_entropy_two_positions_vocab3():
    # Position 0: uniform logits, so log p = -ln 3 for every token; any target distribution gives ln 3.
    # Position 1: logits (0, ln 2, 0) -> softmax (1/4, 1/2, 1/4); one-hot target on token 1 -> ln 2.
    logits = torch.tensor([[0.0, 0.0, 0.0], [0.0, LN2, 0.0]])
    target = torch.tensor([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0]])
    both = soft_cross_entropy(logits, target, torch.tensor([1, 1]))
    assert both.item() == pytest.approx((LN3 + LN2) / 2, abs=1e-6)
    first = soft_cross_entropy(logits, target, torch.tensor([1, 0]))
    assert first.item() == pytest.approx(LN3, abs=1e-6)
    assert soft_cross_entropy(logits, target, torch.tensor([0, 0])).item() == 0.0


def _ttt_case():
    """Target vocab 3, draft vocab {0, 1}; 4 positions; loss on tokens 1..3."""
    target_logits = torch.tensor([[
        [0.0, 9.0, -5.0],      # position 0 (never scored: the first draft predicts token 2)
        [LN2, 0.0, -5.0],      # position 1: draft probs (2/3, 1/3), top token 0 is in the draft vocab
        [0.0, 0.0, -5.0],      # position 2: draft probs (1/2, 1/2), top token 0
        [0.0, 0.0, 7.0],       # position 3: last token, nothing after it to predict
    ]])
    loss_mask = torch.tensor([[0, 1, 1, 1]])
    draft_ids = torch.tensor([0, 1])
    t2d = torch.tensor([True, True, False])
    return target_logits, loss_mask, draft_ids, t2d


def test_eagle3_targets_restrict_and_mask():
    target_logits, loss_mask, draft_ids, t2d = _ttt_case()
    probs, mask = eagle3_targets(target_logits, loss_mask, draft_ids, t2d)
    assert probs[0, 1].tolist() == pytest.approx([2 / 3, 1 / 3], abs=1e-6)
    assert probs[0, 2].tolist() == pytest.approx([0.5, 0.5], abs=1e-6)
    # position 0: loss_mask[1] = 1 and top token 1 in draft -> True; position 3: no next token;
    # out-of-draft top token masks a position even where the next token is trained:
    assert mask.tolist() == [[True, True, True, False]]
    out_of_draft = target_logits.clone()
    out_of_draft[0, 1] = torch.tensor([0.0, 0.0, 9.0])
    _, mask2 = eagle3_targets(out_of_draft, loss_mask, draft_ids, t2d)
    assert mask2.tolist() == [[True, False, True, False]]


def test_eagle3_ttt_loss_by_hand():
    target_logits, loss_mask, draft_ids, t2d = _ttt_case()
    probs, mask = eagle3_targets(target_logits, loss_mask, draft_ids, t2d)
    # Step i row t is scored against position t+1+i (positions 1 and 2 are scored, 3 is not).
    step0 = torch.tensor([[[0.0, 0.0], [LN2, 0.0], [5.0, 5.0], [1.0, 2.0]]])
    step1 = torch.tensor([[[0.0, LN3], [9.0, 9.0], [0.0, 0.0], [0.0, 0.0]]])
    step2 = torch.tensor([[[3.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    total, plosses = eagle3_loss([step0, step1, step2], probs, mask, decay=0.8)
    # step 0: row 0 vs (2/3,1/3) with uniform logits -> ln 2;
    #         row 1: log_softmax(ln2, 0) = (ln 2/3, ln 1/3) vs (1/2,1/2) -> (ln 3/2 + ln 3)/2 = ln(9/2)/2
    p0 = (LN2 + math.log(4.5) / 2) / 2
    # step 1: row 0 vs position 2: log_softmax(0, ln3) = (ln 1/4, ln 3/4) vs (1/2,1/2) -> ln(16/3)/2
    p1 = math.log(16 / 3) / 2
    # step 2: row 0 vs position 3, which is masked -> 0
    assert [p.item() for p in plosses] == pytest.approx([p0, p1, 0.0], abs=1e-6)
    assert total.item() == pytest.approx(p0 + 0.8 * p1, abs=1e-6)
    assert ttt_weights(4) == pytest.approx([1.0, 0.8, 0.64, 0.512])


def test_dflash_slot_weights_and_loss_by_hand():
    w = dflash_slot_weights(4, gamma=2.0)
    assert w.tolist() == pytest.approx([0.0, 1.0, math.exp(-0.5), math.exp(-1.0)])
    # one block of 4 slots over vocab 3: slot 0 (anchor) and slot 3 (past the end) are not scored
    logits = torch.tensor([[[5.0, 0.0, 0.0], [0.0, 0.0, 0.0], [LN2, 0.0, 0.0], [0.0, 9.0, 0.0]]])
    labels = torch.tensor([[1, 0, 0, 2]])
    valid = torch.tensor([[False, True, True, False]])
    # slot 1: uniform -> ln 3 (weight 1); slot 2: softmax (1/2,1/4,1/4), label 0 -> ln 2 (weight e^-1/2)
    expected = (LN3 + math.exp(-0.5) * LN2) / (1 + math.exp(-0.5))
    assert dflash_loss(logits, labels, valid, gamma=2.0).item() == pytest.approx(expected, abs=1e-6)
    flat = weighted_cross_entropy(logits[valid], labels[valid], w.expand_as(labels)[valid])
    assert flat.item() == pytest.approx(expected, abs=1e-6)


def test_default_gamma_for_block_16_halves_weight_around_slot_six():
    w = dflash_slot_weights(16, gamma=7.0)
    assert w[0] == 0 and w[1] == 1
    assert w[15].item() == pytest.approx(math.exp(-2.0))


def test_warmup_cosine_values():
    f = WarmupCosine(total=10, warmup=2, min_ratio=0.1)
    assert f(0) == pytest.approx(0.5)          # (0+1)/2
    assert f(1) == pytest.approx(1.0)
    assert f(2) == pytest.approx(1.0)          # cosine starts at the peak
    assert f(6) == pytest.approx(0.55)         # halfway: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2))
    assert f(10) == pytest.approx(0.1)
    assert warmup_steps_for(1000, 0.015) == 15 and warmup_steps_for(10, 0.0) == 0


def test_scheduler_drives_adamw_lr():
    model = torch.nn.Linear(2, 1)
    frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    model.register_parameter("frozen", frozen)
    opt = build_optimizer(model, lr=2.0)
    assert opt.defaults["betas"] == (0.9, 0.95)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == 3  # weight + bias, not the frozen one
    sched = build_scheduler(opt, total_steps=4, warmup_steps=1)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warmup (0+1)/1 -> 2.0; then cosine over 3 steps: progress 0, 1/3, 2/3
    assert seen == pytest.approx([2.0, 2.0, 2.0 * 0.5 * (1 + math.cos(math.pi / 3)),
                                  2.0 * 0.5 * (1 + math.cos(2 * math.pi / 3))])


def test_clip_gradients_returns_preclip_norm():
    p = torch.nn.Parameter(torch.zeros(2))
    model = torch.nn.Module()
    model.p = p
    p.grad = torch.tensor([3.0, 4.0])
    norm = clip_gradients(model, 1.0)
    assert norm.item() == pytest.approx(5.0)
    assert p.grad.tolist() == pytest.approx([0.6, 0.8], abs=1e-5)
    p.grad = torch.tensor([3.0, 4.0])
    assert clip_gradients(model, 0.0).item() == pytest.approx(5.0)
    assert p.grad.tolist() == [3.0, 4.0]

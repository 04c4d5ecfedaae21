"""Drafter losses.

EAGLE-3: the target distribution at position j (softmax of the target logits, restricted to the
draft vocabulary and renormalised) is the soft label for the token j+1. It counts where
`loss_mask[j+1]` and the target's top token is in the draft vocabulary (`t2d[argmax]`), the
position mask. TTT step i's row t is scored against position j = t+1+i; its loss is the masked
mean of the soft cross-entropy, and the total is sum_i decay^i * ploss_i (decay 0.8).

DFlash: hard-label cross-entropy of slot k against token anchor+k, weighted per slot by
w_k = exp(-(k-1)/gamma) for k >= 1 (slot 0, the clean anchor, has weight 0); the total is the
weighted mean over valid slots: sum(w*ce) / sum(w).
"""

from __future__ import annotations

import bisect
import math

import torch
import torch.nn.functional as F


def ttt_weights(steps: int, decay: float = 0.8) -> list[float]:
    return [decay**i for i in range(steps)]


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over positions where mask is set of -sum_v p_v log softmax(logits)_v (0 without any)."""
    per_pos = -(target_probs.float() * F.log_softmax(logits.float(), dim=-1)).sum(-1)
    mask = mask.to(per_pos.dtype)
    return (per_pos * mask).sum() / mask.sum().clamp_min(1.0)


def eagle3_targets(target_logits: torch.Tensor, loss_mask: torch.Tensor, draft_ids: torch.Tensor, t2d: torch.Tensor):
    """(draft-vocab target probabilities [B,T,D], position mask [B,T]) from target logits [B,T,V].

    Position j's mask: loss_mask[j+1] (the predicted token is trained) and t2d[argmax logits[j]].
    """
    probs = F.softmax(target_logits[..., draft_ids].float(), dim=-1)
    in_draft = t2d[target_logits.argmax(-1)]
    next_trained = torch.zeros_like(in_draft)
    next_trained[:, :-1] = loss_mask[:, 1:].bool()
    return probs, in_draft & next_trained


def eagle3_loss(step_logits: list[torch.Tensor], probs: torch.Tensor, position_mask: torch.Tensor, decay: float = 0.8):
    """(total loss, per-step losses) of a TTT unroll; step i row t is scored against position t+1+i."""
    t = probs.shape[1]
    plosses = []
    for i, logits in enumerate(step_logits):
        n = t - 1 - i
        if n <= 0:
            plosses.append(logits.sum() * 0.0)
            continue
        plosses.append(soft_cross_entropy(logits[:, :n], probs[:, 1 + i :], position_mask[:, 1 + i :]))
    total = sum(w * p for w, p in zip(ttt_weights(len(plosses), decay), plosses))
    return total, plosses


# DFlash's published slot-weight decay per block size (gamma 7 for the standard block of 16).
PUBLISHED_GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def gamma_for_block(block_size: int) -> float:
    """The published gamma for a block size; between and beyond the published sizes, the straight
    line through the nearest two (so a block of 12 gets 5.67 and one of 32 gets 12.33)."""
    if block_size in PUBLISHED_GAMMA:
        return PUBLISHED_GAMMA[block_size]
    sizes = sorted(PUBLISHED_GAMMA)
    j = min(max(bisect.bisect_left(sizes, block_size), 1), len(sizes) - 1)
    lo, hi = sizes[j - 1], sizes[j]
    slope = (PUBLISHED_GAMMA[hi] - PUBLISHED_GAMMA[lo]) / (hi - lo)
    return round(max(PUBLISHED_GAMMA[lo] + slope * (block_size - lo), 0.5), 2)


def dflash_slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..block_size-1, and 0 for slot 0."""
    return torch.tensor([0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)])


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum(w * CE(logits, label)) / sum(w) over rows (0 when all weights are 0)."""
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    weights = weights.to(ce.dtype)
    return (weights * ce).sum() / weights.sum().clamp_min(1e-12)


def dflash_loss(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """Block loss over logits [..., bs, V], labels/valid [..., bs]."""
    bs = labels.shape[-1]
    w = dflash_slot_weights(bs, gamma).to(logits.device).expand_as(labels)
    keep = valid.bool()
    return weighted_cross_entropy(logits[keep], labels[keep], w[keep])

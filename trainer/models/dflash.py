"""DFlash block drafter, laid out like SGLang's / z-lab's `DFlashDraftModel` (Qwen3-style layers).

A block is `block_size` slots at positions anchor..anchor+B-1: slot 0 holds the clean anchor token,
slots 1.. hold the mask token, and slot k predicts the token at anchor+k. The target's context
features (several target layers concatenated, `fc` -> H, `hidden_norm`) give keys/values for every
layer; a block's queries attend to the context strictly before its anchor (causal) and to all
slots of their own block (bidirectional). Token embedding and lm_head are the target's, frozen
(SGLang serves DFlash with the target's embedding and head, so the export carries neither).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.metrics import TOPK, topk_hits
from trainer.models.block_attention import BlockLayout, dflash_attention
from trainer.models.layers import (
    GQAProjections,
    RMSNorm,
    Rotary,
    SwiGLU,
    apply_rope,
    frozen_from_target,
    merge_heads,
    repeat_kv,
    split_heads,
)
from trainer.models.target import TargetSized, sized_like


@dataclass(kw_only=True)
class DFlashConfig(TargetSized):
    target_layer_ids: list[int]
    mask_token_id: int
    num_hidden_layers: int = 1
    block_size: int = 16

    @classmethod
    def from_target(cls, target_config, *, target_layer_ids, mask_token_id: int, block_size: int = 16,
                    num_layers: int = 1):
        return cls(**sized_like(target_config), target_layer_ids=[int(i) for i in target_layer_ids],
                   mask_token_id=int(mask_token_id), num_hidden_layers=num_layers, block_size=block_size)


class DFlashAttention(GQAProjections):
    def __init__(self, cfg: DFlashConfig):
        super().__init__(cfg, in_size=cfg.hidden_size)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x, ctx, rope_q, rope_k, layout: BlockLayout | None):
        """x [B,Q,H] block slots, ctx [B,C,H] projected context; layout: the keys each block sees (None: all)."""
        q = apply_rope(self.q_norm(split_heads(self.q_proj(x), self.heads, self.head_dim)), *rope_q)
        kv_in = torch.cat([ctx, x], dim=1)
        k = apply_rope(self.k_norm(split_heads(self.k_proj(kv_in), self.kv_heads, self.head_dim)), *rope_k)
        v = split_heads(self.v_proj(kv_in), self.kv_heads, self.head_dim)
        groups = self.heads // self.kv_heads
        out = dflash_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), layout, 1.0 / math.sqrt(self.head_dim))
        return self.o_proj(merge_heads(out))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, ctx, rope_q, rope_k, layout):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_k, layout)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """Trainable layers/fc/norms over the frozen target embedding and lm_head."""

    frozen = ("embed_tokens.weight", "lm_head.weight")

    def __init__(self, cfg: DFlashConfig, embed_weight: torch.Tensor | None = None,
                 head_weight: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        frozen_from_target(self.embed_tokens, embed_weight)
        frozen_from_target(self.lm_head, head_weight)
        self.layers = nn.ModuleList(DFlashDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim,
                             cfg.max_position_embeddings, cfg.rope)

    def forward(self, ctx_feats, block_ids, ctx_positions, block_positions, layout: BlockLayout | None = None,
                select=None, labels=None, weights=None):
        """Token logits of the block slots: [B,Q,V], or [M,V] for the slots where `select` [B,Q] is set
        (the lm_head runs inside forward so DDP/FSDP see the whole computation). With `labels` and
        `weights` [M] (training): `head_loss` of the selected slots, no [M, V] logits kept."""
        ctx = self.hidden_norm(self.fc(ctx_feats.to(self.fc.weight.dtype)))
        x = self.embed_tokens(block_ids).to(ctx.dtype)
        rope_q = self.rotary(x, block_positions)
        rope_k = self.rotary(x, torch.cat([ctx_positions, block_positions], dim=1))
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_k, layout)
        x = self.norm(x)
        x = x if select is None else x[select]
        return self.lm_head(x) if labels is None else head_loss(x, self.lm_head.weight, labels, weights)

    @torch.no_grad()
    def draft(self, ctx_feats: torch.Tensor, anchor_id: int, k: int | None = None) -> torch.Tensor:
        """k target token ids (default block size - 1) after an anchor at position n = ctx_feats.shape[1].

        The block is the anchor and k mask slots, as vLLM queries it (num_speculative_tokens + 1 positions;
        SGLang always runs the full block): with k < block size - 1 the missing mask slots are not there
        to attend to, so the drafts are the engine's, not those of a full block cut short."""
        n, bs = ctx_feats.shape[1], self.cfg.block_size
        k = bs - 1 if k is None else k
        if not 1 <= k < bs:
            raise ValueError(f"a DFlash block of {bs} drafts 1..{bs - 1} tokens, not {k}")
        device = ctx_feats.device
        block = torch.full((1, k + 1), self.cfg.mask_token_id, dtype=torch.long, device=device)
        block[0, 0] = anchor_id
        ctx_pos = torch.arange(n, device=device)[None]
        block_pos = torch.arange(n, n + k + 1, device=device)[None]
        return self(ctx_feats, block, ctx_pos, block_pos, None)[0, 1:].argmax(-1)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if k not in self.frozen}


HEAD_CHUNK = 1024  # slots whose full-vocabulary logits (and their float32 copy) are alive at once


def _head_chunk(x, weight, labels, weights):
    logits = F.linear(x, weight)
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    with torch.no_grad():
        hits = [logits.argmax(-1) == labels] + [topk_hits(logits, labels, k) for k in TOPK]
    return ((weights.to(ce.dtype) * ce).sum(), *hits)


def head_loss(x, weight, labels, weights, chunk: int = HEAD_CHUNK):
    """(sum(w * CE(x @ weight.T, label)) / sum(w), top-1 hits [M], {k: top-k hits [M]}) over rows of x [M, H],
    `chunk` rows at a time: each chunk's [chunk, V] logits are recomputed in backward (checkpoint), so
    no [M, V] logits or float32 copy of them is ever held (12 GB per sequence at 512 anchors, V=152k)."""
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    parts: list[list[torch.Tensor]] = [[] for _ in range(1 + len(TOPK))]
    for lo in range(0, x.shape[0], chunk):
        s, *hits = checkpoint(_head_chunk, x[lo:lo + chunk], weight, labels[lo:lo + chunk],
                              weights[lo:lo + chunk], use_reentrant=False)
        total = total + s
        for acc, h in zip(parts, hits):
            acc.append(h)
    cat = [torch.cat(p) if p else torch.zeros(0, dtype=torch.bool, device=x.device) for p in parts]
    loss = total / weights.sum().to(total.dtype).clamp_min(1e-12)
    return loss, cat[0], dict(zip(TOPK, cat[1:]))


def build_blocks(input_ids, loss_mask, lengths, *, block_size: int, num_anchors: int, mask_token_id: int, generator):
    """Sample anchors and lay out the blocks of a batch for `DFlashDrafter.forward`.

    Anchors are positions t >= 1 with loss_mask[t] and loss_mask[t+1]; each sequence gets up to
    `num_anchors` of them (distinct, uniformly sampled, sorted). Returns a dict with block_ids,
    block_positions [B, N*bs], labels/label_valid [B, N, bs] (slot 0 never valid) and the
    attention's `BlockLayout` (each block sees the context before its anchor, a padding block none).
    """
    b, t = input_ids.shape
    device = input_ids.device
    anchors = torch.zeros(b, num_anchors, dtype=torch.long)
    anchor_ok = torch.zeros(b, num_anchors, dtype=torch.bool)
    lm = loss_mask.bool().cpu()
    for i in range(b):
        n = int(lengths[i])
        cand = torch.nonzero(lm[i, 1 : max(n - 1, 1)] & lm[i, 2 : max(n, 2)]).flatten() + 1
        if cand.numel() == 0:
            continue
        pick = cand[torch.randperm(cand.numel(), generator=generator)[:num_anchors]].sort().values
        anchors[i, : pick.numel()] = pick
        anchor_ok[i, : pick.numel()] = True
    anchors, anchor_ok = anchors.to(device), anchor_ok.to(device)
    offsets = torch.arange(block_size, device=device)
    pos = anchors[:, :, None] + offsets  # [B, N, bs]
    inside = pos < torch.as_tensor(lengths, device=device)[:, None, None]
    gathered = torch.gather(input_ids, 1, pos.clamp(max=t - 1).flatten(1)).view_as(pos)
    block_ids = torch.full_like(pos, mask_token_id)
    block_ids[:, :, 0] = gathered[:, :, 0]
    label_valid = inside & anchor_ok[:, :, None] & (offsets > 0)
    label_valid &= torch.gather(loss_mask.bool(), 1, pos.clamp(max=t - 1).flatten(1)).view_as(pos)
    return {
        "block_ids": block_ids.flatten(1),
        "block_positions": pos.flatten(1),
        "labels": gathered,
        "label_valid": label_valid,
        "layout": BlockLayout(torch.where(anchor_ok, anchors, 0), block_size, t),
        "anchors": anchors,
        "anchor_valid": anchor_ok,
    }


@dataclass
class NoiseSchedule:
    """Strength of the context-feature noise at a step: linear ramp 0 -> start over `warmup` steps,
    then linear from start to `end` at `total` steps (0 everywhere when start and end are 0)."""

    start: float = 0.0
    end: float = 0.0
    warmup: int = 0
    total: int = 1

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.start * step / self.warmup
        span = max(self.total - self.warmup, 1)
        frac = min(max(step - self.warmup, 0) / span, 1.0)
        return self.start + (self.end - self.start) * frac


def add_feature_noise(feats: torch.Tensor, strength: float, generator) -> torch.Tensor:
    """feats + strength * rms(feats per token) * N(0, 1): corruption relative to each token's scale."""
    if strength <= 0:
        return feats
    x = feats.float()
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    noise = torch.randn(x.shape, generator=generator, device=generator.device).to(x.device)
    return (x + strength * rms * noise).to(feats.dtype)

"""Training objectives: what EAGLE-3 and DFlash do differently, one class each (as SpecForge's algorithms/).

The trainer owns data, optimiser, loop and checkpoints; an objective owns its drafter's construction,
the teacher signal it needs from the target, and its loss and metrics:

- EAGLE-3: three fused aux layers; a draft-vocabulary drafter unrolled `ttt_length` steps (training-time
  test), each step's distribution matched to the target's next-token distribution (soft labels from the
  target's logits), step losses weighted `ttt_decay**i`.
- DFlash: blocks of `block_size` masked tokens after sampled anchor positions, predicted in parallel from
  the target's context features; hard labels over the full target vocabulary, slot k weighted
  exp(-(k-1)/gamma); optional noise on the context features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ops.errors import UserError
from trainer.distributed import unwrap
from trainer.losses import (
    dflash_slot_weights,
    eagle3_loss,
    eagle3_targets,
)
from trainer.metrics import Stats, dflash_hit_stats, eagle3_stats
from trainer.models import init_drafter
from trainer.models.dflash import (
    DFlashConfig,
    NoiseSchedule,
    add_feature_noise,
    build_blocks,
)
from trainer.models.eagle3 import Eagle3Config, Eagle3Drafter
from trainer.models.target import target_architectures
from trainer.sglang_rules import sglang_layer_ids
from trainer.vocab import load_draft_vocab


class Eagle3Objective:
    """EAGLE-3: soft-label TTT loss over the draft vocabulary."""

    mode = "eagle3"
    lr = 1e-4             # the reference's peak learning rate
    warmup_ratio = 0.015  # share of all steps spent warming up
    needs_target_logits = True  # the soft labels come from the target's lm_head

    def __init__(self, cfg):
        self.cfg = cfg
        self.head: torch.Tensor | None = None  # the target's lm_head, offline only (online, the target gives logits)

    def check_aux_layers(self, aux_layers) -> None:
        if len(aux_layers) != 3:
            raise UserError(f"EAGLE-3 fuses 3 aux layers; the data has {len(aux_layers)} ({list(aux_layers)})")

    def describe(self) -> list[str]:
        return []

    def build(self, target_cfg, aux_layers, embed, head, *, online: bool, device, compute_dtype, total_steps: int):
        """The unwrapped drafter (the draft vocabulary maps d2t/t2d come from --vocab)."""
        c = self.cfg
        d2t, t2d = load_draft_vocab(c.vocab)
        if t2d.numel() != target_cfg.vocab_size:
            raise UserError(f"{c.vocab}: t2d covers {t2d.numel()} tokens but the target vocabulary has "
                            f"{target_cfg.vocab_size}; built for another model?")
        architectures = target_architectures(c.target)
        sglang_layer_ids(architectures, aux_layers)  # refuse now ids SGLang could not serve, not at the export
        model_cfg = Eagle3Config.from_target(target_cfg, draft_vocab_size=d2t.numel(), aux_layer_ids=list(aux_layers),
                                             ttt_length=c.ttt_length, target_architectures=architectures)
        drafter = init_drafter(model_cfg, embed, head, d2t=d2t, t2d=t2d, seed=c.seed)
        self.head = None if online else head.to(device, compute_dtype)
        return drafter

    def offline_target_logits(self, batch, compute_dtype):
        """Offline shards store the target's last hidden state; its logits are one matmul with lm_head."""
        if self.head is None:
            raise RuntimeError("offline target logits need the lm_head, kept by build(online=False)")
        return torch.matmul(batch["last"].to(compute_dtype), self.head.T)

    def loss(self, model, aux, target_logits, batch, *, step: int, generators) -> tuple[torch.Tensor, Stats]:
        c = self.cfg
        plain = unwrap(model)
        assert isinstance(plain, Eagle3Drafter)  # build() made it
        step_logits = model(aux, batch["input_ids"], c.ttt_length)
        probs, pmask = eagle3_targets(target_logits, batch["loss_mask"], plain.draft_ids(), plain.t2d)
        loss, plosses = eagle3_loss(step_logits, probs, pmask, c.ttt_decay)
        stats = eagle3_stats(step_logits, probs, pmask)
        for i, pl in enumerate(plosses):
            stats.add(f"ploss_{i}", pl.detach(), 1)
        return loss, stats


@dataclass(frozen=True)
class DFlashParts:
    """What DFlash's loss needs besides the drafter, fixed when it is built."""
    mask_token_id: int
    slot_weights: torch.Tensor  # exp(-(k-1)/gamma) per block slot
    noise: NoiseSchedule        # context-feature noise strength per step


class DFlashObjective:
    """DFlash: block-parallel hard-label loss over the target vocabulary."""

    mode = "dflash"
    lr = 6e-4
    warmup_ratio = 0.04
    needs_target_logits = False

    def __init__(self, cfg):
        self.cfg = cfg
        self._parts: DFlashParts | None = None

    @property
    def parts(self) -> DFlashParts:
        if self._parts is None:
            raise RuntimeError("DFlash's loss needs build() first")
        return self._parts

    def check_aux_layers(self, aux_layers) -> None:
        pass  # DFlash reads any number of target layers

    def describe(self) -> list[str]:
        c = self.cfg
        lines = ["dflash predicts over the target vocabulary with the target's lm_head; --vocab is not used"] \
            if c.vocab else []
        shape = (f"dflash: block size {c.block_size}, gamma {c.gamma:g}, up to {c.num_anchors} anchors per "
                 f"sequence, {c.draft_layers} draft layers")
        return [*lines, shape]

    def build(self, target_cfg, aux_layers, embed, head, *, online: bool, device, compute_dtype, total_steps: int):
        c = self.cfg
        model_cfg = DFlashConfig.from_target(target_cfg, target_layer_ids=list(aux_layers),
                                             mask_token_id=mask_token_id(c, target_cfg), block_size=c.block_size,
                                             num_layers=c.draft_layers)
        self._parts = DFlashParts(
            mask_token_id=model_cfg.mask_token_id,
            slot_weights=dflash_slot_weights(c.block_size, c.gamma).to(device),
            noise=NoiseSchedule(c.noise_start, c.noise_end, c.noise_warmup_steps, total_steps))
        return init_drafter(model_cfg, embed, head, seed=c.seed)

    def offline_target_logits(self, batch, compute_dtype):
        return None

    def loss(self, model, aux, target_logits, batch, *, step: int, generators) -> tuple[torch.Tensor, Stats]:
        c, parts = self.cfg, self.parts
        strength = parts.noise(step)
        aux = add_feature_noise(aux, strength, generators["device"])
        lengths = batch["lengths"].tolist()
        lm = batch["loss_mask"].bool()  # anchor positions: loss_mask[t] and loss_mask[t+1], t >= 1
        available = int((lm[:, 1:-1] & lm[:, 2:]).sum(1).max()) if lm.shape[1] > 2 else 0
        anchors = max(1, min(c.num_anchors, available))
        blocks = build_blocks(batch["input_ids"], batch["loss_mask"], lengths, block_size=c.block_size,
                              num_anchors=anchors, mask_token_id=parts.mask_token_id, generator=generators["cpu"])
        valid = blocks["label_valid"]
        b, t = batch["input_ids"].shape
        ctx_pos = torch.arange(t, device=batch["input_ids"].device)[None].expand(b, t)
        # the loss over the full target vocabulary is taken inside forward, a chunk of slots at a time
        loss, top1, topk = model(aux, blocks["block_ids"], ctx_pos, blocks["block_positions"], blocks["layout"],
                                 valid.flatten(1), labels=blocks["labels"][valid],
                                 weights=parts.slot_weights.expand_as(valid)[valid])
        stats = dflash_hit_stats(top1, topk, valid)
        stats.add("noise", strength, 1)
        return loss, stats


OBJECTIVES = {o.mode: o for o in (Eagle3Objective, DFlashObjective)}


def mask_token_id(cfg, target_cfg) -> int:
    """DFlash's mask token: --mask-token-id, else the tokenizer's mask, a spare embedding row, or pad."""
    if cfg.mask_token_id is not None:
        if not 0 <= cfg.mask_token_id < target_cfg.vocab_size:
            raise UserError(f"--mask-token-id {cfg.mask_token_id} is outside the target vocabulary "
                            f"({target_cfg.vocab_size})")
        return cfg.mask_token_id
    try:
        from transformers import AutoTokenizer  # lazy: transformers: 1.4 s to import

        tok = AutoTokenizer.from_pretrained(cfg.target, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError):
        tok = None
    if tok is not None:
        if tok.mask_token_id is not None and tok.mask_token_id < target_cfg.vocab_size:
            return int(tok.mask_token_id)
        mask = tok.convert_tokens_to_ids("<|MASK|>")
        if isinstance(mask, int) and mask != tok.unk_token_id and 0 <= mask < target_cfg.vocab_size:
            return mask
        if len(tok) < target_cfg.vocab_size:
            return len(tok)  # an embedding row no token uses
        if tok.pad_token_id is not None:
            return int(tok.pad_token_id)
    if isinstance(target_cfg.pad_token_id, int):
        return target_cfg.pad_token_id
    raise UserError(f"{cfg.target}: no mask, spare or pad token for DFlash; give --mask-token-id")

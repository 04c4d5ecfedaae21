"""Drafter models: EAGLE-3 (`eagle3`), DFlash (`dflash`), shared layers and target helpers."""

from __future__ import annotations

import torch

from trainer.models.dflash import DFlashConfig, DFlashDrafter
from trainer.models.eagle3 import Eagle3Config, Eagle3Drafter


def init_drafter(cfg, embed: torch.Tensor, head: torch.Tensor, *, d2t=None, t2d=None, seed: int = 0):
    """A freshly initialised drafter (the state training starts from): random layers from `seed`,
    the target's embedding (and, for DFlash, lm_head) frozen; the EAGLE-3 draft head starts as the
    target lm_head's rows of the draft tokens."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if isinstance(cfg, Eagle3Config):
            model = Eagle3Drafter(cfg, d2t, t2d, embed.float())
            with torch.no_grad():
                model.lm_head.weight.copy_(head.float()[model.draft_ids()])
            return model
        return DFlashDrafter(cfg, embed.float(), head.float())


__all__ = ["DFlashConfig", "DFlashDrafter", "Eagle3Config", "Eagle3Drafter", "init_drafter"]

"""AdamW (betas 0.9/0.95 as in the EAGLE reference), linear warmup then cosine decay, grad clipping."""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, lr: float, *, betas=(0.9, 0.95), weight_decay: float = 0.0,
                    eps: float = 1e-8):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, eps=eps)


class WarmupCosine:
    """LR multiplier for the step about to run (0-based): (s+1)/warmup while s < warmup, then
    cosine from 1 down to min_ratio at s = total."""

    def __init__(self, total: int, warmup: int, min_ratio: float = 0.0):
        self.total, self.warmup, self.min_ratio = int(total), int(warmup), float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min((step - self.warmup) / max(self.total - self.warmup, 1), 1.0)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.0):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(total_steps, warmup_steps, min_ratio))


def warmup_steps_for(total_steps: int, ratio: float) -> int:
    return int(math.ceil(total_steps * ratio)) if ratio > 0 else 0


def clip_gradients(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip trainable gradients to max_norm (<= 0: measure only); returns the pre-clip total norm."""
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    if not params:
        return torch.zeros(())
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm and max_norm > 0 else float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP returns a DTensor

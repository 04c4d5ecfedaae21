"""Building blocks shared by the drafters: RMSNorm, SwiGLU MLP, rotary embedding, GQA projections and helpers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models.target import TargetSized


class RMSNorm(nn.Module):
    """Llama/Qwen RMSNorm: normalise in float32, scale by a learned weight, cast back."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class SwiGLU(nn.Module):
    """Llama MLP: down(silu(gate(x)) * up(x)); parameter names as in HF/SGLang checkpoints."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GQAProjections(nn.Module):
    """Grouped-query attention's q/k/v/o projections (no bias), named as in HF/SGLang checkpoints:
    q, k and v read `in_size` features, o writes the hidden size; heads and head_dim are the target's."""

    def __init__(self, cfg: TargetSized, in_size: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)


def frozen_from_target(module: nn.Module, weight: torch.Tensor | None) -> None:
    """module's weight is the target's (embedding or lm_head): never trained, and copied from `weight`
    when it is given (else it is loaded later, as from a checkpoint)."""
    module.weight.requires_grad_(False)
    if weight is not None:
        with torch.no_grad():
            module.weight.copy_(weight)


def rope_config(hidden_size: int, num_heads: int, head_dim: int, max_positions: int, rope: dict | None):
    """A transformers LlamaConfig carrying only what the rotary embedding needs."""
    from transformers import LlamaConfig

    params = dict(rope or {"rope_type": "default", "rope_theta": 10000.0})
    return LlamaConfig(
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters=params,
    )


class Rotary(nn.Module):
    """Rotary position embedding of the target's kind (default, llama3, yarn...) via transformers."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, max_positions: int, rope: dict | None):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.inner = LlamaRotaryEmbedding(rope_config(hidden_size, num_heads, head_dim, max_positions, rope))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape [B, T, head_dim] for integer positions [B, T]."""
        return self.inner(x, positions)


# Backends for SDPA with a dense boolean mask on CUDA: the memory-efficient kernel, else the math one.
# Left to itself PyTorch may pick cuDNN for bf16 on SM90, whose attn_mask path has produced NaN gradients.
MASKED_SDPA_BACKENDS = ("EFFICIENT_ATTENTION", "MATH")


def masked_sdpa(q, k, v, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """scaled_dot_product_attention with a boolean mask [B, 1|heads, Q, K] (None: all), on a pinned
    backend on CUDA (MASKED_SDPA_BACKENDS)."""
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, name) for name in MASKED_SDPA_BACKENDS]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, T, D] by cos/sin [B, T, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def split_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """[B, T, heads*D] -> [B, heads, T, D]."""
    b, t, _ = x.shape
    return x.view(b, t, heads, head_dim).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, T, D] -> [B, T, heads*D]."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Expand grouped key/value heads [B, kv, T, D] to [B, kv*groups, T, D]."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)

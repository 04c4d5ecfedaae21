"""Building blocks shared by the drafters: RMSNorm, SwiGLU MLP, rotary embedding, GQA projections and helpers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

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


def frozen_from_target(module: nn.Embedding | nn.Linear, weight: torch.Tensor | None) -> None:
    """module's weight is the target's (embedding or lm_head): never trained, and copied from `weight`
    when it is given (else it is loaded later, as from a checkpoint)."""
    module.weight.requires_grad_(False)
    if weight is not None:
        with torch.no_grad():
            module.weight.copy_(weight)


def rope_config(hidden_size: int, num_heads: int, head_dim: int, max_positions: int, rope: dict | None):
    """A transformers LlamaConfig carrying only what the rotary embedding needs."""
    from transformers import LlamaConfig  # lazy: transformers: 1.4 s to import

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
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # lazy: transformers: 1.4 s to import

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


class ChainAttention(torch.autograd.Function):
    """EAGLE-3's training-time-test attention without a materialised T x T score matrix.

    Query row r (at row index rows[r]) attends to the step-0 keys k0[..., :rows[r] + 1, :] (causal) and
    to its own chain keys kc[j][..., r, :] (one per later TTT step: the "diagonal"). Computed in blocks of
    query rows with a running log-sum-exp, as flash attention does: the forward keeps only the output
    and one log-sum-exp per row, the backward recomputes each block's probabilities. Peak memory is
    one block's scores ([B, heads, BLOCK, T] float32) instead of all T x T of them, for every TTT step.

    apply(q [B,h,R,D], k0 [B,h,T,D], v0 [B,h,T,D], rows [R] int, scale, kc [B,h,R,D,J], vc [B,h,R,D,J]);
    J may be 0. Softmax in float32; the output has q's dtype."""

    BLOCK = 256

    @staticmethod
    def _block(q, k0, v0, rows, scale, kc, vc, lo, hi):
        """Scores of query rows lo:hi: (s0 [B,h,C,T] float32, masked; sd [B,h,C,J] float32)."""
        f = _softmax_dtype(q)
        s0 = torch.matmul(q[:, :, lo:hi], k0.transpose(-1, -2)).to(f) * scale
        keys = torch.arange(k0.shape[2], device=q.device)
        s0 = s0.masked_fill(keys[None, :] > rows[lo:hi, None], float("-inf"))
        sd = (q[:, :, lo:hi, :, None].to(f) * kc[:, :, lo:hi].to(f)).sum(-2) * scale
        return s0, sd

    @staticmethod
    def forward(ctx, q, k0, v0, rows, scale, kc, vc):
        f = _softmax_dtype(q)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=f, device=q.device)
        for lo in range(0, q.shape[2], ChainAttention.BLOCK):
            hi = min(lo + ChainAttention.BLOCK, q.shape[2])
            s0, sd = ChainAttention._block(q, k0, v0, rows, scale, kc, vc, lo, hi)
            m = torch.maximum(s0.amax(-1), sd.amax(-1) if sd.shape[-1] else s0.amax(-1))
            p0, pd = (s0 - m[..., None]).exp(), (sd - m[..., None]).exp()
            total = p0.sum(-1) + pd.sum(-1)
            acc = torch.matmul(p0.to(v0.dtype), v0).to(f) + (pd[..., None, :] * vc[:, :, lo:hi].to(f)).sum(-1)
            out[:, :, lo:hi] = (acc / total[..., None]).to(q.dtype)
            lse[:, :, lo:hi] = m + total.log()
        ctx.save_for_backward(q, k0, v0, rows, kc, vc, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k0, v0, rows, kc, vc, out, lse = ctx.saved_tensors
        scale = ctx.scale
        f = _softmax_dtype(q)
        dq = torch.zeros(q.shape, dtype=f, device=q.device)
        dk0 = torch.zeros(k0.shape, dtype=f, device=q.device)
        dv0 = torch.zeros(v0.shape, dtype=f, device=q.device)
        dkc = torch.zeros(kc.shape, dtype=f, device=q.device)
        dvc = torch.zeros(vc.shape, dtype=f, device=q.device)
        for lo in range(0, q.shape[2], ChainAttention.BLOCK):
            hi = min(lo + ChainAttention.BLOCK, q.shape[2])
            s0, sd = ChainAttention._block(q, k0, v0, rows, scale, kc, vc, lo, hi)
            p0, pd = (s0 - lse[:, :, lo:hi, None]).exp(), (sd - lse[:, :, lo:hi, None]).exp()
            do = dout[:, :, lo:hi].to(f)
            delta = (do * out[:, :, lo:hi].to(f)).sum(-1, keepdim=True)
            ds0 = p0 * (torch.matmul(do.to(v0.dtype), v0.transpose(-1, -2)).to(f) - delta)
            dsd = pd * ((do[..., None] * vc[:, :, lo:hi].to(f)).sum(-2) - delta)
            qb = q[:, :, lo:hi].to(f)
            dq[:, :, lo:hi] = (torch.matmul(ds0.to(k0.dtype), k0).to(f)
                               + (dsd[..., None, :] * kc[:, :, lo:hi].to(f)).sum(-1)) * scale
            dk0 += torch.matmul(ds0.transpose(-1, -2).to(q.dtype), q[:, :, lo:hi]).to(f) * scale
            dv0 += torch.matmul(p0.transpose(-1, -2).to(dout.dtype), dout[:, :, lo:hi]).to(f)
            dkc[:, :, lo:hi] = dsd[..., None, :] * qb[..., None] * scale
            dvc[:, :, lo:hi] = pd[..., None, :] * do[..., None]
        return (dq.to(q.dtype), dk0.to(k0.dtype), dv0.to(v0.dtype), None, None, dkc.to(kc.dtype),
                dvc.to(vc.dtype))


class CpuChainAttention(torch.autograd.Function):
    """`ChainAttention` for every row at once on CPU (R == T), on PyTorch's fused flash kernel for CPU.

    The causal part runs in the kernel SDPA itself dispatches to on CPU
    (`aten._scaled_dot_product_flash_attention_for_cpu`, which also returns each row's log-sum-exp); the
    J diagonal chain keys are merged with the log-sum-exp trick, as SpecForge's cached-merge attention does.
    The backward hands the kernel's backward the merged output and log-sum-exp, which makes its gradients
    those of the merged softmax, and adds the diagonal's. No T x T scores are materialised; the kernel
    skips the masked half of the causal matrix (the row blocks recompute every key: 5-10x slower).

    apply(q [B,h,T,D], k0 [B,h,T,D], v0 [B,h,T,D], scale, kc [B,h,T,D,J], vc [B,h,T,D,J]); J may be 0."""

    @staticmethod
    def forward(ctx, q, k0, v0, scale, kc, vc):
        out0, lse0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k0, v0, 0.0, True, scale=scale)
        sd = torch.einsum("bhrd,bhrdj->bhrj", q, kc) * scale
        lse = torch.logaddexp(lse0, sd.logsumexp(-1)) if sd.shape[-1] else lse0
        pd = (sd - lse[..., None]).exp()
        out = out0 * (lse0 - lse).exp()[..., None] + torch.einsum("bhrj,bhrdj->bhrd", pd, vc)
        ctx.save_for_backward(q, k0, v0, kc, vc, out, lse, pd)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k0, v0, kc, vc, out, lse, pd = ctx.saved_tensors
        scale = ctx.scale
        dout = dout.contiguous()
        dq, dk0, dv0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k0, v0, out, lse, 0.0, True, scale=scale)
        delta = (dout * out).sum(-1, keepdim=True)
        dsd = pd * (torch.einsum("bhrd,bhrdj->bhrj", dout, vc) - delta)
        dq = dq + torch.einsum("bhrj,bhrdj->bhrd", dsd, kc) * scale
        dkc = torch.einsum("bhrj,bhrd->bhrdj", dsd, q) * scale
        dvc = torch.einsum("bhrj,bhrd->bhrdj", pd, dout)
        return dq, dk0, dv0, None, dkc, dvc


_CPU_FLASH = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")


def fused_cpu_kernel() -> bool:
    """This torch has the CPU flash kernel and its backward (aten underscore ops, present in 2.5-2.13 at least:
    not public API, so a torch without them takes the row blocks instead of failing)."""
    return all(hasattr(torch.ops.aten, name) for name in _CPU_FLASH)


def chain_attention(q, k0, v0, rows: torch.Tensor, scale: float, kc, vc) -> torch.Tensor:
    """EAGLE-3's TTT attention (arguments as `ChainAttention.apply`): on CPU over every row, the fused
    `CpuChainAttention`; otherwise (CUDA, or a subset of rows when drafting) the row blocks."""
    if (q.device.type == "cpu" and q.shape[2] == k0.shape[2] and q.dtype in (torch.float32, torch.float64)
            and fused_cpu_kernel()):
        return CpuChainAttention.apply(q.contiguous(), k0.contiguous(), v0.contiguous(), scale, kc, vc)
    return ChainAttention.apply(q, k0, v0, rows, scale, kc, vc)


def _softmax_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half/bfloat16/float32 inputs, float64 for float64 (tests compare in double)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32

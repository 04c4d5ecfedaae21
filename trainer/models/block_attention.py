"""DFlash's attention: each block's slots see the context before the block's anchor and every slot of their block.

`BlockLayout` says which keys those are (one count per block, not a dense mask). On CPU in float32/float64
`CpuBlockAttention` computes it in two parts merged by log-sum-exp, with no [queries x (context + queries)]
scores or mask; elsewhere (CUDA, bfloat16, a torch without the CPU flash kernel) the masked SDPA over
`BlockLayout.dense`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from trainer.models.layers import fused_cpu_kernel, masked_sdpa


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """Keys of N blocks of `block_size` slots over a context of `length` positions: block n of sequence b sees
    context keys [0, context[b, n]) (its anchor; 0 for a padding block) and the slots of block n."""

    context: torch.Tensor  # [B, N] integer
    block_size: int
    length: int

    @cached_property
    def dense(self) -> torch.Tensor:
        """The same as a boolean mask [B, N*block_size, length + N*block_size] (built once, on first use)."""
        b, n = self.context.shape
        device = self.context.device
        block_of_q = torch.arange(n * self.block_size, device=device) // self.block_size
        keys = torch.arange(self.length, device=device)
        ctx = keys[None, None, :] < self.context[:, block_of_q, None]
        own = (block_of_q[:, None] == block_of_q[None, :]).expand(b, -1, -1)
        return torch.cat([ctx, own], dim=2)


def dflash_attention(q, k, v, layout: BlockLayout | None, scale: float) -> torch.Tensor:
    """q [B,h,N*bs,D] of the block slots, k/v [B,h,T+N*bs,D] (context keys, then the slots'), layout None:
    every key (drafting one block). On CPU in float32/float64 with the flash kernel, `CpuBlockAttention`;
    otherwise (CUDA, bf16, CPU autocast, no kernel) SDPA over the dense mask."""
    if layout is None:
        return masked_sdpa(q, k, v, None, scale)
    # under CPU autocast (`--dtype bfloat16` on CPU) q/k leave RMSNorm in float32 and v stays bf16: dense path
    if (q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and q.dtype == k.dtype == v.dtype
            and not torch.is_autocast_enabled("cpu") and fused_cpu_kernel()):
        return CpuBlockAttention.apply(q, k, v, layout.context, layout.block_size, scale)
    return masked_sdpa(q, k, v, layout.dense[:, None], scale)


class CpuBlockAttention(torch.autograd.Function):
    """DFlash's attention on CPU without the dense mask: the own-block part as [bs x bs] scores per block, the
    context part on PyTorch's CPU flash kernel (`aten._scaled_dot_product_flash_attention_for_cpu`, which also
    returns each row's log-sum-exp), `CHUNK_QUERIES` query rows at a time against only the context keys the
    chunk's blocks can see (a [chunk x keys] additive mask), merged by log-sum-exp. The backward hands the
    kernel's backward the merged output and log-sum-exp, which makes its gradients those of the whole
    softmax, and adds the own-block part's. Work and memory grow with T, not with (T + queries) per query.

    apply(q [B,h,N*bs,D], k [B,h,T+N*bs,D], v (as k), context [B,N] integer, block_size, scale)."""

    CHUNK_QUERIES = 512  # 2x fewer kernel calls than 256, 1.4-2x faster fwd+bwd (T=2048, 8 heads, 2 cores)

    @staticmethod
    def _chunks(context: torch.Tensor, bs: int):
        """(first row, last row + 1, context keys any of its blocks sees, context [B, blocks]) per chunk."""
        per = max(1, CpuBlockAttention.CHUNK_QUERIES // bs)
        seen = context.amax(0).tolist()
        for lo in range(0, context.shape[1], per):
            hi = min(lo + per, context.shape[1])
            keys = max(seen[lo:hi])
            if keys:
                yield lo * bs, hi * bs, keys, context[:, lo:hi]

    @staticmethod
    def _mask(context: torch.Tensor, bs: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, blocks*bs, keys]: 0 on the context keys each row's block sees, -inf elsewhere."""
        seen = torch.arange(keys, device=context.device)[None, None, :] < context[:, :, None]
        mask = torch.zeros(seen.shape, dtype=dtype, device=context.device).masked_fill_(~seen, float("-inf"))
        return mask.repeat_interleave(bs, dim=1)[:, None]

    @staticmethod
    def _own(q, k, v, t: int, bs: int, scale: float):
        """Per-block views (q, k, v as [B,h,N,bs,D]) and the own-block scores [B,h,N,bs,bs]."""
        b, h, nq, d = q.shape
        qb = q.view(b, h, nq // bs, bs, d)
        kb, vb = (x[:, :, t:].reshape(b, h, nq // bs, bs, d) for x in (k, v))
        return qb, kb, vb, torch.matmul(qb, kb.transpose(-1, -2)) * scale

    @staticmethod
    def forward(ctx, q, k, v, context, bs: int, scale: float):
        b, h, nq, d = q.shape
        t = k.shape[2] - nq
        qb, kb, vb, s = CpuBlockAttention._own(q, k, v, t, bs, scale)
        lse = s.logsumexp(-1)
        out = torch.matmul((s - lse[..., None]).exp(), vb).reshape(b, h, nq, d)
        lse = lse.reshape(b, h, nq)
        for r0, r1, keys, seen in CpuBlockAttention._chunks(context, bs):
            oc, lc = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, r0:r1], k[:, :, :keys], v[:, :, :keys], 0.0, False,
                attn_mask=CpuBlockAttention._mask(seen, bs, keys, q.dtype), scale=scale)
            # a row that sees no context key gets lse 0 from the kernel: it has no mass there
            lc = lc.masked_fill((seen == 0).repeat_interleave(bs, dim=1)[:, None], float("-inf"))
            merged = torch.logaddexp(lc, lse[:, :, r0:r1])
            out[:, :, r0:r1] = (oc * (lc - merged).exp()[..., None]
                                + out[:, :, r0:r1] * (lse[:, :, r0:r1] - merged).exp()[..., None])
            lse[:, :, r0:r1] = merged
        ctx.save_for_backward(q, k, v, context, out, lse)
        ctx.bs, ctx.scale = bs, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, context, out, lse = ctx.saved_tensors
        bs, scale = ctx.bs, ctx.scale
        b, h, nq, d = q.shape
        t = k.shape[2] - nq
        dout = dout.contiguous()
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        qb, kb, vb, s = CpuBlockAttention._own(q, k, v, t, bs, scale)
        p = (s - lse.view(b, h, nq // bs, bs, 1)).exp()
        dob = dout.view(b, h, nq // bs, bs, d)
        delta = (dout * out).sum(-1).view(b, h, nq // bs, bs, 1)
        ds = p * (torch.matmul(dob, vb.transpose(-1, -2)) - delta)
        dq = (torch.matmul(ds, kb) * scale).reshape(b, h, nq, d)
        dk[:, :, t:] = (torch.matmul(ds.transpose(-1, -2), qb) * scale).reshape(b, h, nq, d)
        dv[:, :, t:] = torch.matmul(p.transpose(-1, -2), dob).reshape(b, h, nq, d)
        for r0, r1, keys, seen in CpuBlockAttention._chunks(context, bs):
            dqc, dkc, dvc = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout[:, :, r0:r1], q[:, :, r0:r1], k[:, :, :keys], v[:, :, :keys], out[:, :, r0:r1],
                lse[:, :, r0:r1], 0.0, False, attn_mask=CpuBlockAttention._mask(seen, bs, keys, q.dtype),
                scale=scale)
            dq[:, :, r0:r1] += dqc
            dk[:, :, :keys] += dkc
            dv[:, :, :keys] += dvc
        return dq, dk, dv, None, None, None

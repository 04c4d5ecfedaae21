"""EAGLE-3's TTT attention, in row blocks (`ChainAttention`) and on CPU's fused flash kernel
(`CpuChainAttention`), equals the plain one, values and gradients, and holds no T x T scores: peak
memory grows linearly with the sequence length."""

from __future__ import annotations

import pytest
import torch

from trainer.models.layers import ChainAttention, CpuChainAttention, chain_attention
from trainer.peak_memory import peak_cpu_bytes


def reference(q, k0, v0, rows, scale, kc, vc):
    """The materialised formulation: [B,h,R,T] scores plus the diagonal, one softmax."""
    scores = torch.matmul(q, k0.transpose(-1, -2)) * scale
    keys = torch.arange(k0.shape[2])
    scores = scores.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
    diag = (q[..., None] * kc).sum(-2) * scale
    probs = torch.cat([scores, diag], -1).softmax(-1)
    n0 = k0.shape[2]
    return torch.matmul(probs[..., :n0], v0) + (probs[..., None, n0:] * vc).sum(-1)


@pytest.mark.parametrize("chain", [0, 1, 3])
@pytest.mark.parametrize("rows", ["all", "last"])
def test_blocked_chain_attention_equals_the_plain_one(chain, rows, monkeypatch):
    monkeypatch.setattr(ChainAttention, "BLOCK", 5)  # several blocks, a ragged last one
    g = torch.Generator().manual_seed(chain)
    b, h, t, d = 2, 3, 13, 8
    r = torch.arange(t) if rows == "all" else torch.tensor([t - 1])
    shapes = [(b, h, len(r), d), (b, h, t, d), (b, h, t, d), (b, h, len(r), d, chain), (b, h, len(r), d, chain)]
    q, k0, v0, kc, vc = (torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes)
    want = reference(q, k0, v0, r, 0.3, kc, vc)
    got = ChainAttention.apply(q, k0, v0, r, 0.3, kc, vc)
    torch.testing.assert_close(got, want)
    dout = torch.randn(want.shape, generator=g, dtype=torch.float64)
    gw = torch.autograd.grad(want, (q, k0, v0, kc, vc), dout)
    gg = torch.autograd.grad(got, (q, k0, v0, kc, vc), dout)
    for a, e in zip(gg, gw):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chain", [0, 1, 6])
def test_fused_cpu_chain_attention_equals_the_plain_and_the_blocked_one(chain, dtype):
    g = torch.Generator().manual_seed(10 + chain)
    b, h, t, d = 2, 3, 37, 16
    shapes = [(b, h, t, d)] * 3 + [(b, h, t, d, chain)] * 2
    q, k0, v0, kc, vc = (torch.randn(s, generator=g, dtype=dtype, requires_grad=True) for s in shapes)
    rows = torch.arange(t)
    dout = torch.randn(b, h, t, d, generator=g, dtype=dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}
    fused = CpuChainAttention.apply(q, k0, v0, 0.3, kc, vc)
    for other in (reference(q, k0, v0, rows, 0.3, kc, vc), ChainAttention.apply(q, k0, v0, rows, 0.3, kc, vc)):
        torch.testing.assert_close(fused, other, **tol)
        got = torch.autograd.grad(fused, (q, k0, v0, kc, vc), dout, retain_graph=True)
        want = torch.autograd.grad(other, (q, k0, v0, kc, vc), dout)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, **tol)


def test_chain_attention_takes_the_fused_kernel_for_every_row_on_cpu_and_row_blocks_for_a_subset(monkeypatch):
    calls = []
    monkeypatch.setattr(CpuChainAttention, "apply", lambda *a: calls.append("fused") or a[0])
    monkeypatch.setattr(ChainAttention, "apply", lambda *a: calls.append("blocks") or a[0])
    q, kc = torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4, 1)
    chain_attention(q, q, q, torch.arange(5), 0.5, kc, kc)
    chain_attention(q[:, :, -1:], q, q, torch.tensor([4]), 0.5, kc[:, :, -1:], kc[:, :, -1:])
    assert calls == ["fused", "blocks"]


def test_a_torch_without_the_cpu_flash_kernel_takes_the_row_blocks(monkeypatch):
    """The fused path rests on aten underscore ops: the pinned torch has them; another one may not."""
    import trainer.models.layers as layers

    assert layers.fused_cpu_kernel()          # torch 2.13.0 (the laptop's) and 2.11.0 (the node stack's) have them
    calls = []
    monkeypatch.setattr(layers, "_CPU_FLASH", ("_no_such_kernel",))
    monkeypatch.setattr(CpuChainAttention, "apply", lambda *a: calls.append("fused") or a[0])
    monkeypatch.setattr(ChainAttention, "apply", lambda *a: calls.append("blocks") or a[0])
    q, kc = torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4, 1)
    chain_attention(q, q, q, torch.arange(5), 0.5, kc, kc)
    assert calls == ["blocks"]


def blocked(q, k0, v0, kc, vc):
    return ChainAttention.apply(q, k0, v0, torch.arange(q.shape[2]), 0.25, kc, vc)


def fused(q, k0, v0, kc, vc):
    return CpuChainAttention.apply(q, k0, v0, 0.25, kc, vc)


def _peak_bytes(t: int, fn) -> int:
    g = torch.Generator().manual_seed(0)
    b, h, d = 1, 4, 16
    q, k0, v0 = (torch.randn(b, h, t, d, generator=g, requires_grad=True) for _ in range(3))
    kc, vc = (torch.randn(b, h, t, d, 2, generator=g, requires_grad=True) for _ in range(2))

    def step() -> None:
        fn(q, k0, v0, kc, vc).sum().backward()

    return peak_cpu_bytes(step)


@pytest.mark.parametrize("fn", [blocked, fused])
def test_peak_memory_grows_linearly_not_quadratically(fn):
    small, large = _peak_bytes(1024, fn), _peak_bytes(4096, fn)
    # T x T scores would make 4x the length cost 16x the memory; one block of rows at a time costs 4x
    assert large < 6 * small, (small, large)

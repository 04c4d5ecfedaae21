"""EAGLE-3's TTT attention in blocks (`ChainAttention`) equals the plain one, values and gradients, and
holds no T x T scores: peak memory grows linearly with the sequence length."""

from __future__ import annotations

import pytest
import torch

from trainer.models.layers import ChainAttention
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


def _peak_bytes(t: int) -> int:
    g = torch.Generator().manual_seed(0)
    b, h, d = 1, 4, 16
    q, k0, v0 = (torch.randn(b, h, t, d, generator=g, requires_grad=True) for _ in range(3))
    kc, vc = (torch.randn(b, h, t, d, 2, generator=g, requires_grad=True) for _ in range(2))

    def step() -> None:
        out = ChainAttention.apply(q, k0, v0, torch.arange(t), 0.25, kc, vc)
        out.sum().backward()

    return peak_cpu_bytes(step)


def test_peak_memory_grows_linearly_not_quadratically():
    small, large = _peak_bytes(1024), _peak_bytes(4096)
    # T x T scores would make 4x the length cost 16x the memory; one block of rows at a time costs 4x
    assert large < 6 * small, (small, large)

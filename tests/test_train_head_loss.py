"""DFlash's full-vocabulary loss in chunks (`head_loss`) equals the plain one, loss, gradients and hits,
and never holds the [M, V] logits or their float32 copy."""

from __future__ import annotations

import torch

from trainer.losses import weighted_cross_entropy
from trainer.metrics import TOPK, topk_hits
from trainer.models.dflash import head_loss
from trainer.peak_memory import peak_cpu_bytes


def test_chunked_head_loss_equals_the_plain_one():
    g = torch.Generator().manual_seed(0)
    m, h, v = 37, 16, 101
    x = torch.randn(m, h, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, h, generator=g, dtype=torch.float64)
    labels = torch.randint(0, v, (m,), generator=g)
    weights = torch.rand(m, generator=g, dtype=torch.float64)
    logits = x @ w.T
    want = weighted_cross_entropy(logits, labels, weights)
    loss, top1, topk = head_loss(x, w, labels, weights, chunk=8)
    torch.testing.assert_close(loss, want.to(loss.dtype))
    assert torch.equal(top1, logits.argmax(-1) == labels)
    assert all(torch.equal(topk[k], topk_hits(logits, labels, k)) for k in TOPK)
    (gx_want,) = torch.autograd.grad(want, x)
    (gx,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(gx, gx_want.to(gx.dtype))


def _peak_bytes(m: int, v: int, chunked: bool) -> int:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, 64, generator=g, requires_grad=True)
    w = torch.randn(v, 64, generator=g)
    labels = torch.randint(0, v, (m,), generator=g)
    weights = torch.ones(m)

    def step() -> None:
        if chunked:
            loss = head_loss(x, w, labels, weights, chunk=256)[0]
        else:
            loss = weighted_cross_entropy(x @ w.T, labels, weights)
        loss.backward()

    return peak_cpu_bytes(step)


def test_no_full_vocabulary_logits_are_held():
    m, v = 4096, 8192
    full = m * v * 4  # one float32 [M, V] tensor: 128 MiB
    chunked = _peak_bytes(m, v, chunked=True)
    assert chunked < full / 4, (chunked, full)
    assert _peak_bytes(m, v, chunked=False) > full  # the plain loss holds at least one

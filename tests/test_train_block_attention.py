"""DFlash's block attention split in two on CPU (`CpuBlockAttention`: each block's queries against the context
before its anchor on the CPU flash kernel, plus its own block's keys, merged by log-sum-exp) equals the masked
SDPA over the dense mask, values and gradients; falls back to that SDPA where the kernel is missing; holds no
[queries x (context + queries)] scores or mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trainer.models.block_attention as block_attention
from trainer.models.block_attention import BlockLayout, CpuBlockAttention, dflash_attention
from trainer.models.layers import masked_sdpa
from trainer.peak_memory import peak_cpu_bytes


def masked(q, k, v, layout: BlockLayout, scale: float):
    """The formulation it replaces: SDPA with the dense boolean mask [B, 1, Q, T + Q]."""
    return masked_sdpa(q, k, v, layout.dense[:, None], scale)


def inputs(b, h, t, n, bs, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n * bs, d, generator=g, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, h, t + n * bs, d, generator=g, dtype=dtype, requires_grad=True) for _ in range(2))
    return q, k, v, torch.randn(b, h, n * bs, d, generator=g, dtype=dtype)


def assert_same(layout, q, k, v, dout, scale, **tol):
    want = masked(q, k, v, layout, scale)
    got = CpuBlockAttention.apply(q, k, v, layout.context, layout.block_size, scale)
    torch.testing.assert_close(got, want, **tol)
    gw = torch.autograd.grad(want, (q, k, v), dout)
    gg = torch.autograd.grad(got, (q, k, v), dout)
    for a, e in zip(gg, gw):
        torch.testing.assert_close(a, e, **tol)


TOL = {torch.float64: {}, torch.float32: dict(atol=2e-5, rtol=2e-5)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("t, bs, context", [
    (37, 4, [[1, 5, 9, 20, 36, 0], [3, 3, 3, 37, 0, 0]]),     # sorted anchors, padding blocks (no context) at the end
    (13, 1, [[13, 0, 7, 2, 13, 1], [0, 0, 0, 0, 0, 0]]),      # unsorted; one sequence sees no context at all
    (64, 16, [[63, 1, 40, 17, 0, 64], [8, 9, 10, 11, 12, 13]]),
])
def test_split_attention_equals_the_masked_sdpa(t, bs, context, dtype, monkeypatch):
    monkeypatch.setattr(CpuBlockAttention, "CHUNK_QUERIES", 2 * bs)  # several chunks of blocks, a ragged last one
    layout = BlockLayout(torch.tensor(context), bs, t)
    q, k, v, dout = inputs(2, 3, t, 6, bs, 16, dtype, seed=t)
    assert_same(layout, q, k, v, dout, 0.3, **TOL[dtype])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_split_attention_equals_the_masked_sdpa_fuzzed(data):
    b, h = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    t, n, bs = data.draw(st.integers(1, 24)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 5))
    context = data.draw(st.lists(st.lists(st.integers(0, t), min_size=n, max_size=n), min_size=b, max_size=b))
    chunk = data.draw(st.integers(1, n * bs + 3))
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32]))
    old = CpuBlockAttention.CHUNK_QUERIES
    CpuBlockAttention.CHUNK_QUERIES = chunk
    try:
        q, k, v, dout = inputs(b, h, t, n, bs, 8, dtype, seed=data.draw(st.integers(0, 2**16)))
        assert_same(BlockLayout(torch.tensor(context), bs, t), q, k, v, dout, 0.35, **TOL[dtype])
    finally:
        CpuBlockAttention.CHUNK_QUERIES = old


def test_dense_mask_by_hand():
    """Block n's slots see context keys [0, context[n]) and every slot of block n, nothing else."""
    mask = BlockLayout(torch.tensor([[2, 0]]), 2, 3).dense
    assert mask[0].int().tolist() == [
        [1, 1, 0, 1, 1, 0, 0],
        [1, 1, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 1, 1],
    ]


def _calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(CpuBlockAttention, "apply", lambda *a: calls.append("split") or a[0])
    monkeypatch.setattr(block_attention, "masked_sdpa", lambda q, k, v, mask, scale: calls.append(
        "dense" if mask is not None else "all") or q)
    return calls


def test_cpu_float_takes_the_split_attention_and_others_the_masked_sdpa(monkeypatch):
    calls = _calls(monkeypatch)
    layout = BlockLayout(torch.tensor([[1, 2]]), 2, 3)
    q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 7, 8)
    dflash_attention(q, k, k, layout, 0.5)
    dflash_attention(q.double(), k.double(), k.double(), layout, 0.5)
    dflash_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(), layout, 0.5)  # a dtype the merge is not written for
    dflash_attention(q, k, k, None, 0.5)  # drafting: every key
    dflash_attention(q, k, k.bfloat16(), layout, 0.5)   # q/k out of RMSNorm in float32, v bf16 (CPU autocast)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dflash_attention(q, k, k, layout, 0.5)
    assert calls == ["split", "split", "dense", "all", "dense", "dense"]


def test_a_torch_without_the_cpu_flash_kernel_takes_the_masked_sdpa(monkeypatch):
    import trainer.models.layers as layers

    assert layers.fused_cpu_kernel()
    calls = _calls(monkeypatch)
    monkeypatch.setattr(layers, "_CPU_FLASH", ("_no_such_kernel",))
    dflash_attention(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 7, 8), torch.zeros(1, 2, 7, 8),
                     BlockLayout(torch.tensor([[1, 2]]), 2, 3), 0.5)
    assert calls == ["dense"]


def _peak(t: int, attend) -> int:
    b, h, n, bs, d = 1, 2, 256, 16, 16
    q, k, v, _ = inputs(b, h, t, n, bs, d, torch.float32, seed=0)
    anchors = torch.linspace(1, t - 1, n).long()[None]
    layout = BlockLayout(anchors, bs, t)

    def step() -> None:
        attend(q, k, v, layout).sum().backward()

    return peak_cpu_bytes(step)


def test_split_attention_holds_no_dense_scores_or_mask():
    split = lambda q, k, v, layout: dflash_attention(q, k, v, layout, 0.25)  # noqa: E731
    dense = lambda q, k, v, layout: masked(q, k, v, layout, 0.25)  # noqa: E731
    q_len = 256 * 16
    peaks = []
    for t in (1024, 4096):
        float_mask = q_len * (t + q_len) * 4  # the dense path's mask alone, as SDPA converts it to float
        peaks.append(_peak(t, split))
        assert peaks[-1] < float_mask / 8, (t, peaks[-1], float_mask)
        assert peaks[-1] < _peak(t, dense) / 4
    assert peaks[1] < 5 * peaks[0]  # a chunk's [512 x keys] mask at most: linear in T


def test_a_dflash_training_step_on_cpu_equals_the_masked_one(monkeypatch):
    """The drafter's loss and every gradient, two layers, two sequences with padding blocks: the same through the
    split attention as through the dense-mask SDPA."""
    import trainer.models.layers as layers
    from tests.test_train_models import V, target_config
    from trainer.models import init_drafter
    from trainer.models.dflash import DFlashConfig, build_blocks

    g = torch.Generator().manual_seed(3)
    embed, head = torch.randn(V, 32, generator=g), torch.randn(V, 32, generator=g)
    cfg = DFlashConfig.from_target(target_config(), target_layer_ids=[1, 2, 3], mask_token_id=V - 1, block_size=4,
                                   num_layers=2)
    model = init_drafter(cfg, embed, head, seed=1).train()
    b, t = 2, 40
    ids = torch.randint(0, V - 1, (b, t), generator=g)
    lm = torch.ones(b, t, dtype=torch.long)
    lm[1, 25:] = 0
    blocks = build_blocks(ids, lm, [t, 25], block_size=4, num_anchors=30, mask_token_id=V - 1, generator=g)
    assert not blocks["anchor_valid"][1].all()  # the second sequence has padding blocks
    feats = torch.randn(b, t, 3 * 32, generator=g)
    ctx_pos = torch.arange(t)[None].expand(b, t)
    valid = blocks["label_valid"]

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss, _, _ = model(feats, blocks["block_ids"], ctx_pos, blocks["block_positions"], blocks["layout"],
                           valid.flatten(1), labels=blocks["labels"][valid], weights=torch.ones(int(valid.sum())))
        loss.backward()
        return loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    split = loss_and_grads()
    monkeypatch.setattr(layers, "_CPU_FLASH", ("_no_such_kernel",))
    dense = loss_and_grads()
    torch.testing.assert_close(split[0], dense[0], atol=1e-5, rtol=1e-5)
    assert split[1].keys() == dense[1].keys() and len(split[1]) > 10
    for name in split[1]:
        torch.testing.assert_close(split[1][name], dense[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_dflash_training_step_under_cpu_bf16_autocast_runs_and_learns_finite_gradients():
    """`nodedeck-train train --dtype bfloat16` on CPU runs the forward under autocast: q/k come out of RMSNorm
    in float32 while v stays bf16, which the flash kernel refuses (it crashed the first step)."""
    from tests.test_train_models import V, target_config
    from trainer.models import init_drafter
    from trainer.models.dflash import DFlashConfig, build_blocks

    g = torch.Generator().manual_seed(4)
    embed, head = torch.randn(V, 32, generator=g), torch.randn(V, 32, generator=g)
    cfg = DFlashConfig.from_target(target_config(), target_layer_ids=[1, 2, 3], mask_token_id=V - 1, block_size=4,
                                   num_layers=2)
    model = init_drafter(cfg, embed, head, seed=1).train()
    t = 24
    ids = torch.randint(0, V - 1, (1, t), generator=g)
    blocks = build_blocks(ids, torch.ones(1, t, dtype=torch.long), [t], block_size=4, num_anchors=10,
                          mask_token_id=V - 1, generator=g)
    valid = blocks["label_valid"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = model(torch.randn(1, t, 3 * 32, generator=g), blocks["block_ids"],
                           torch.arange(t)[None], blocks["block_positions"], blocks["layout"], valid.flatten(1),
                           labels=blocks["labels"][valid], weights=torch.ones(int(valid.sum())))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

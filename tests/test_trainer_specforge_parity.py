"""Exports checked against the peer implementation: SpecForge's own draft model classes load them
and compute the same logits as nodedeck's modules (float32, tolerance 1e-5).

`specforge` is installed without its dependencies (`pip install --no-deps specforge==0.2.0`), for
these tests only; they are skipped where it is missing.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from tests.support.torch_threads import one_thread
from tests.test_train_models import D, H, V, eagle3
from trainer.export import export_drafter

specforge_eagle3 = pytest.importorskip("specforge.modeling.draft.llama3_eagle",
                                       reason="specforge is not installed (pip install --no-deps specforge==0.2.0)")


@pytest.fixture(autouse=True)
def eager_one_thread():
    """SpecForge wraps its RMSNorm in torch.compile: run it eagerly (no C++ toolchain needed)."""
    with one_thread(), torch.compiler.set_stance("force_eager"):
        yield


def test_eagle3_export_loads_into_specforge_with_the_same_logits(tmp_path):
    model = eagle3(seed=4, ttt=4)
    with torch.no_grad():  # move every trainable weight off its initial value
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    out = export_drafter(model, tmp_path / "final", dtype="float32")
    config = LlamaConfig.from_pretrained(out)
    peer = specforge_eagle3.LlamaForCausalLMEagle3(config, attention_backend="sdpa").eval()
    missing, unexpected = peer.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    assert (missing, unexpected) == ([], [])
    assert torch.equal(peer.d2t, model.d2t) and torch.equal(peer.t2d, model.t2d)

    b, t, steps = 2, 9, 4
    g = torch.Generator().manual_seed(0)
    aux, ids = torch.randn(b, t, 3 * H, generator=g), torch.randint(0, V, (b, t), generator=g)
    with torch.no_grad():
        ours = model(aux, ids, steps)
        # SpecForge's TTT loop (OnlineEagle3Model): step i reads token t+1+i, keys cached per step
        hidden = peer.project_hidden_states(aux)
        mask = peer.prepare_decoder_attention_mask(torch.ones(b, t, dtype=torch.bool), hidden, b, t, 0)
        positions = torch.arange(t)[None]
        cache = [[], []]
        shifted = torch.cat([ids[:, 1:], torch.zeros(b, 1, dtype=ids.dtype)], dim=1)
        for i in range(steps):
            hidden = peer.backbone(peer.embed_input_ids(shifted), hidden, cache, mask, positions, use_cache=False)
            logits = peer.compute_logits(hidden)
            assert logits.shape == (b, t, D)
            torch.testing.assert_close(ours[i], logits, atol=1e-5, rtol=1e-5)
            shifted = torch.cat([shifted[:, 1:], torch.zeros(b, 1, dtype=ids.dtype)], dim=1)


def test_dflash_export_loads_into_specforge_with_the_same_logits(tmp_path):
    from transformers import Qwen3Config

    from tests.test_train_models import target_config
    from trainer.models import init_drafter
    from trainer.models.block_attention import BlockLayout
    from trainer.models.dflash import DFlashConfig

    specforge_dflash = pytest.importorskip("specforge.modeling.draft.dflash")
    g = torch.Generator().manual_seed(7)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    cfg = DFlashConfig.from_target(target_config(), target_layer_ids=[1, 2, 3], mask_token_id=V - 1, block_size=8,
                                   num_layers=2)
    model = init_drafter(cfg, embed, head, seed=1).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    out = export_drafter(model, tmp_path / "final", dtype="float32")
    config = Qwen3Config.from_pretrained(out)
    peer = specforge_dflash.DFlashDraftModel(config).eval()
    assert peer.target_layer_ids == [1, 2, 3] and peer.block_size == 8 and peer.mask_token_id == V - 1
    missing, unexpected = peer.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    assert (missing, unexpected) == ([], [])

    b, c, q = 2, 10, 8
    ctx = torch.randn(b, c, 3 * H, generator=g)
    block = torch.full((b, q), V - 1)
    block[:, 0] = torch.tensor([3, 11])
    ctx_pos = torch.arange(c)[None].expand(b, c)
    block_pos = torch.arange(c, c + q)[None].expand(b, q)
    # all context visible, then a row that sees only the context before its anchor (6 tokens), on CPU through
    # the split attention (SpecForge: its dense mask)
    layout = BlockLayout(torch.tensor([[c], [6]]), q, c)
    assert layout.dense[1, :, 6:c].sum() == 0 and layout.dense.sum() == b * q * (c + q) - q * (c - 6)
    with torch.no_grad():
        for blocks in (None, layout):
            ours = model(ctx, block, ctx_pos, block_pos, blocks)
            hidden = peer(position_ids=torch.cat([ctx_pos, block_pos], dim=1),
                          attention_mask=None if blocks is None else blocks.dense[:, None],
                          noise_embedding=model.embed_tokens(block), target_hidden=ctx)
            torch.testing.assert_close(ours, model.lm_head(hidden), atol=1e-5, rtol=1e-5)

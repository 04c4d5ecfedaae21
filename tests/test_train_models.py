"""Drafter models: EAGLE-3 TTT attention vs inference, DFlash blocks, noise schedule, SGLang export."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

from ops.errors import UserError
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from trainer.export import export_drafter, load_export
from trainer.models import init_drafter
from trainer.models.dflash import DFlashConfig, NoiseSchedule, add_feature_noise, build_blocks
from trainer.models.eagle3 import ChainCache, Eagle3Config
from trainer.models.layers import apply_rope, repeat_kv, split_heads

H, V, D = 32, 50, 20


def target_config():
    return LlamaConfig(hidden_size=H, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=V, max_position_embeddings=256, tie_word_embeddings=False)


def vocab_maps():
    used = torch.arange(0, V, 2)[:D]  # every other token, sorted
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(D), t2d


def eagle3(seed=0, ttt=4):
    g = torch.Generator().manual_seed(100 + seed)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    d2t, t2d = vocab_maps()
    cfg = Eagle3Config.from_target(target_config(), draft_vocab_size=D, aux_layer_ids=[1, 2, 3], ttt_length=ttt)
    return init_drafter(cfg, embed, head, d2t=d2t, t2d=t2d, seed=seed).eval()


def test_step0_attention_is_plain_causal_attention():
    model = eagle3()
    attn = model.midlayer.self_attn
    x = torch.randn(2, 7, 2 * H)
    pos = torch.arange(7)[None].expand(2, 7)
    cos, sin = model.rotary(x, pos)
    got = attn(x, cos, sin, torch.arange(7), ChainCache())
    q = apply_rope(split_heads(attn.q_proj(x), 4, 8), cos, sin)
    k = repeat_kv(apply_rope(split_heads(attn.k_proj(x), 2, 8), cos, sin), 2)
    v = repeat_kv(split_heads(attn.v_proj(x), 2, 8), 2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 7, 32)
    assert torch.allclose(got, attn.o_proj(ref), atol=1e-5)


def test_ttt_unroll_equals_inference_chain_with_teacher_forcing():
    """TTT step i at row t must equal drafting from the prefix 0..t with the true tokens fed back."""
    torch.manual_seed(0)
    model = eagle3(ttt=4)
    t = 9
    aux = torch.randn(1, t, 3 * H)
    ids = torch.randint(0, V, (1, t))
    train_logits = model(aux, ids, 4)
    for row in (0, 3, 4):
        rows = torch.arange(row + 1)
        cache = ChainCache()
        hidden, logits = model.step(model.fc(aux[:, : row + 1]), ids[:, 1 : row + 2], rows[None], rows, cache)
        assert torch.allclose(logits[0, row], train_logits[0][0, row], atol=1e-5)
        hidden = hidden[:, -1:]
        last = rows[-1:]
        for i in range(1, 4):
            if row + 1 + i >= t:
                break
            token = ids[:, row + 1 + i : row + 2 + i]
            hidden, logits = model.step(hidden, token, (last + i)[None], last, cache)
            assert torch.allclose(logits[0, 0], train_logits[i][0, row], atol=1e-5), (row, i)


def test_draft_chain_feeds_back_its_own_tokens():
    torch.manual_seed(1)
    model = eagle3(ttt=3)
    aux, nxt = torch.randn(1, 5, 3 * H), torch.randint(0, V, (1, 5))
    chain = model.draft(aux, nxt, 3)
    assert chain.shape == (3,)
    assert all(model.t2d[chain].tolist())  # drafts are target ids from the draft vocabulary
    # re-run the chain by hand with the drafted tokens as inputs
    rows = torch.arange(5)
    cache = ChainCache()
    hidden, logits = model.step(model.fc(aux), nxt, rows[None], rows, cache)
    hidden, logits = hidden[:, -1:], logits[:, -1:]
    for i in range(3):
        tok = model.draft_ids()[logits.argmax(-1)]
        assert tok.item() == chain[i].item()
        hidden, logits = model.step(hidden, tok, (rows[-1:] + 1 + i)[None], rows[-1:], cache)


def test_embedding_is_frozen_and_kept_out_of_checkpoints():
    model = eagle3()
    assert not model.embed_tokens.weight.requires_grad
    assert "embed_tokens.weight" not in model.trainable_state_dict()
    # the draft head starts from the target head's rows of the draft tokens
    g = torch.Generator().manual_seed(100)
    _embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    assert torch.equal(model.lm_head.weight, head[model.draft_ids()])


SGLANG_EAGLE3_NAMES = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}


def test_eagle3_export_layout_and_reload(tmp_path):
    model = eagle3(seed=3, ttt=5)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    out = export_drafter(model, tmp_path / "final", dtype="float32", summary={"trained_steps": 7})
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == H and config["vocab_size"] == V
    assert config["draft_vocab_size"] == D and config["num_key_value_heads"] == 2 and config["head_dim"] == 8
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # SGLang: output of layer k
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]  # vLLM: input of layer k
    assert config["torch_dtype"] == "float32" and config["tie_word_embeddings"] is False
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == SGLANG_EAGLE3_NAMES
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_slice("midlayer.self_attn.q_proj.weight").get_shape() == [32, 2 * H]  # q/k/v take 2H
        assert f.get_slice("fc.weight").get_shape() == [H, 3 * H]
    back = load_export(out)
    aux, ids = torch.randn(2, 6, 3 * H), torch.randint(0, V, (2, 6))
    for a, b in zip(model(aux, ids), back(aux, ids)):
        assert torch.allclose(a, b, atol=1e-6)
    # bfloat16 export (the default) reloads within bf16 precision
    bf = load_export(export_drafter(model, tmp_path / "bf16"))
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    diff = (model(aux, ids)[0] - bf(aux, ids)[0]).abs().max().item()
    assert diff < 0.1


@pytest.fixture(scope="module")
def saved_target(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    torch.manual_seed(0)
    LlamaForCausalLM(target_config()).save_pretrained(d)
    return d


def dflash(target_dir, block=4, layers=2):
    from trainer.models.target import load_embed_and_head

    embed, head = load_embed_and_head(target_dir)
    cfg = DFlashConfig.from_target(target_config(), target_layer_ids=[0, 2, 4], mask_token_id=V - 1,
                                   block_size=block, num_layers=layers)
    return init_drafter(cfg, embed, head, seed=0).eval()


def test_dflash_export_layout_and_reload(tmp_path, saved_target):
    model = dflash(saved_target)
    out = export_drafter(model, tmp_path / "d", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 4
    assert config["dflash_config"] == {"block_size": 4, "target_layer_ids": [0, 2, 4], "mask_token_id": V - 1}
    assert config["num_target_layers"] == 6 and config["num_hidden_layers"] == 2
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "embed_tokens.weight" not in names and "lm_head.weight" not in names  # SGLang uses the target's
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_norm.weight",
            "layers.0.self_attn.k_norm.weight", "layers.0.mlp.down_proj.weight"} <= names
    with pytest.raises(UserError, match="give the target model directory"):
        load_export(out)
    back = load_export(out, saved_target)
    feats = torch.randn(1, 5, 3 * H)
    assert torch.equal(model.draft(feats, 7), back.draft(feats, 7))
    ctx_pos, blk_pos = torch.arange(5)[None], torch.arange(5, 9)[None]
    blk = torch.tensor([[7, V - 1, V - 1, V - 1]])
    assert torch.allclose(model(feats, blk, ctx_pos, blk_pos), back(feats, blk, ctx_pos, blk_pos), atol=1e-6)


def test_dflash_blocks_by_hand():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24, 25, 0, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0]])
    g = torch.Generator().manual_seed(0)
    b = build_blocks(ids, loss_mask, [8, 6], block_size=3, num_anchors=8, mask_token_id=99, generator=g)
    # eligible anchors t >= 1 with loss_mask[t] and loss_mask[t+1]: row 0 -> 2, 3, 6; row 1 -> 1..4
    assert b["anchors"][0, :3].tolist() == [2, 3, 6] and b["anchor_valid"][0].sum() == 3
    assert b["anchors"][1, :4].tolist() == [1, 2, 3, 4] and b["anchor_valid"][1].sum() == 4
    blocks = b["block_ids"].view(2, 8, 3)
    assert blocks[0, 0].tolist() == [12, 99, 99] and blocks[1, 3].tolist() == [24, 99, 99]
    assert b["block_positions"].view(2, 8, 3)[0, 2].tolist() == [6, 7, 8]
    # labels: slot k = token anchor+k, scored where inside the sequence and loss-masked, never slot 0
    assert b["labels"][0, 0].tolist() == [12, 13, 14]
    assert b["label_valid"][0, 0].tolist() == [False, True, True]
    assert b["label_valid"][0, 1].tolist() == [False, True, False]  # token 5 is not trained
    assert b["label_valid"][0, 2].tolist() == [False, True, False]  # anchor 6: token 8 is past the end
    assert b["label_valid"][1, 3].tolist() == [False, True, False]  # anchor 4: token 6 is padding
    # attention: block j sees context positions < its anchor and every slot of its own block
    mask = b["layout"].dense  # [B, 8*3, 8 + 8*3]
    q = 1 * 3 + 2  # row 0, block 1 (anchor 3), slot 2
    assert mask[0, q, :8].tolist() == [True, True, True, False, False, False, False, False]
    own = mask[0, q, 8:].view(8, 3)
    assert own[1].all() and own.sum() == 3
    assert not mask[0, 3 * 3, :8].any() and not b["anchor_valid"][0, 3]  # padding block: no context


def test_noise_schedule_ramps_linearly_from_zero():
    s = NoiseSchedule(start=0.2, end=0.05, warmup=10, total=30)
    ramp = [s(i) for i in range(11)]
    assert ramp[0] == 0.0 and ramp[5] == pytest.approx(0.1) and ramp[10] == pytest.approx(0.2)
    assert all(b - a == pytest.approx(0.02) for a, b in zip(ramp, ramp[1:]))  # strictly rising, not constant
    assert s(20) == pytest.approx(0.125) and s(30) == pytest.approx(0.05) and s(99) == pytest.approx(0.05)
    assert NoiseSchedule()(5) == 0.0


def test_feature_noise_scales_with_token_rms():
    g = torch.Generator().manual_seed(0)
    feats = torch.ones(1, 4, 1000) * 3.0
    assert torch.equal(add_feature_noise(feats, 0.0, g), feats)
    noisy = add_feature_noise(feats, 0.1, g)
    assert (noisy - feats).std().item() == pytest.approx(0.3, rel=0.1)


@pytest.mark.parametrize("mode", ["eagle3", "dflash"])
def test_drafter_rope_equals_the_exported_configs(tmp_path, mode):
    """A server builds its rotary embedding from config.json: it must be the one the drafter trained with."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaled = LlamaConfig(hidden_size=H, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=V, max_position_embeddings=512,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})
    d2t, t2d = vocab_maps()
    g = torch.Generator().manual_seed(1)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    if mode == "eagle3":
        cfg = Eagle3Config.from_target(scaled, draft_vocab_size=D, aux_layer_ids=[1, 2, 3])
        model = init_drafter(cfg, embed, head, d2t=d2t, t2d=t2d)
    else:
        cfg = DFlashConfig.from_target(scaled, target_layer_ids=[1, 2, 3], mask_token_id=V - 1, block_size=4)
        model = init_drafter(cfg, embed, head)
    config = json.loads((export_drafter(model, tmp_path / "x", dtype="float32") / "config.json").read_text())
    assert config["rope_theta"] == 500000.0
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    served = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in config.items() if k != "nodedeck"}))
    assert torch.equal(model.rotary.inner.inv_freq, served.inv_freq)
    assert model.rotary.inner.attention_scaling == served.attention_scaling
    default = LlamaRotaryEmbedding(LlamaConfig(hidden_size=H, num_attention_heads=4, rope_theta=500000.0))
    assert not torch.equal(served.inv_freq, default.inv_freq)  # the scaling is really applied


@pytest.mark.parametrize("mode", ["eagle3", "dflash"])
def test_the_targets_weights_are_copied_in_and_never_trained(mode):
    g = torch.Generator().manual_seed(2)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    if mode == "eagle3":
        d2t, t2d = vocab_maps()
        cfg = Eagle3Config.from_target(target_config(), draft_vocab_size=D, aux_layer_ids=[1, 2, 3])
        model = init_drafter(cfg, embed, head, d2t=d2t, t2d=t2d)
    else:
        cfg = DFlashConfig.from_target(target_config(), target_layer_ids=[0, 2, 4], mask_token_id=V - 1)
        model = init_drafter(cfg, embed, head)
    params = dict(model.named_parameters())
    assert torch.equal(params["embed_tokens.weight"], embed)
    if mode == "dflash":
        assert torch.equal(params["lm_head.weight"], head)
    assert {n for n, p in params.items() if not p.requires_grad} == set(model.frozen)


def test_dflash_draft_queries_k_plus_one_slots_as_vllm(saved_target):
    """vLLM's DFlash query is the bonus token and num_speculative_tokens mask slots, not the whole trained block:
    with K < block - 1 the drafts are those of a (K + 1)-slot block, whose slots attend to fewer mask slots."""
    model = dflash(saved_target, block=8)
    feats = torch.randn(1, 5, 3 * H)
    full = model(feats, torch.tensor([[7] + [V - 1] * 7]), torch.arange(5)[None], torch.arange(5, 13)[None])
    assert torch.equal(model.draft(feats, 7), full[0, 1:].argmax(-1))
    for k in (1, 3):
        short = model(feats, torch.tensor([[7] + [V - 1] * k]), torch.arange(5)[None], torch.arange(5, 6 + k)[None])
        assert torch.equal(model.draft(feats, 7, k), short[0, 1:].argmax(-1))
        assert not torch.allclose(short[0, 1:], full[0, 1:k + 1])        # the missing slots change the logits
    for k in (0, 8):
        with pytest.raises(ValueError, match="drafts 1..7 tokens"):
            model.draft(feats, 7, k)

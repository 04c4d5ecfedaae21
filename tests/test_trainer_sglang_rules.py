"""What SGLang does with a drafter's layer ids and YaRN scale, per target architecture, and the
drafter's attention shape for MLA targets.

SGLang is not installed here: its rules are restated below from its source (0.5.14 .. 0.5.23) in the
few lines that decide them, and nodedeck's export is checked against them."""

from __future__ import annotations

import math

import pytest
import torch

from ops.errors import UserError
from trainer.export import dflash_config_json, eagle3_config_json
from trainer.models.dflash import DFlashConfig
from trainer.models.eagle3 import Eagle3Config
from trainer.models.layers import Rotary
from trainer.models.target import sized_like
from trainer.sglang_rules import sglang_layer_ids, yarn_mscale


def sglang_captures(architecture: str, layer_ids: list[int], mode: str = "eagle3") -> list[int]:
    """The decoder-layer OUTPUTS SGLang captures for `layer_ids` (it records the input of layer k,
    i.e. the output of k - 1, for each k in `layers_to_capture`)."""
    if mode == "dflash":
        to_capture = [i + 1 for i in layer_ids]           # set_dflash_layers_to_capture: always + 1
    elif architecture in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        to_capture = [i + 1 for i in layer_ids] if layer_ids and layer_ids[0] == 1 else list(layer_ids)
    else:                                                  # LlamaForCausalLM, Qwen3ForCausalLM, ...
        to_capture = [i + 1 for i in layer_ids]
    return [k - 1 for k in to_capture]


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM",
                                  "DeepseekV2ForCausalLM"])
@pytest.mark.parametrize("trained", [[1, 30, 57], [2, 30, 57], [3, 29, 58], [5, 6, 7]])
def test_sglang_captures_exactly_the_trained_layers(arch, trained):
    assert sglang_captures(arch, sglang_layer_ids([arch], trained)) == trained


def test_the_export_hands_deepseek_the_ids_that_capture_the_trained_layers():
    cfg = Eagle3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       vocab_size=100, target_hidden_size=64, target_num_layers=61, draft_vocab_size=50,
                       aux_layer_ids=[2, 30, 57], target_architectures=["DeepseekV3ForCausalLM"])
    ids = eagle3_config_json(cfg, "bfloat16")["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert sglang_captures("DeepseekV3ForCausalLM", ids) == [2, 30, 57]
    llama = eagle3_config_json(Eagle3Config(**{**cfg.to_dict(), "target_architectures": ["LlamaForCausalLM"]}),
                               "bfloat16")
    assert llama["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 57]


def test_deepseek_layer_zero_is_refused_in_one_line():
    with pytest.raises(UserError, match="cannot capture the output of layer 0"):
        sglang_layer_ids(["DeepseekV3ForCausalLM"], [0, 30, 57])
    assert sglang_layer_ids(["LlamaForCausalLM"], [0, 1, 2]) == [0, 1, 2]


def test_qwen2_dflash_capture_is_refused_in_one_line():
    with pytest.raises(UserError, match="no DFlash layer capture"):
        sglang_layer_ids(["Qwen2ForCausalLM"], [1, 9, 17], "dflash")
    assert sglang_layer_ids(["Qwen3ForCausalLM"], [1, 9, 17], "dflash") == [1, 9, 17]


# ---- YaRN ---------------------------------------------------------------------------------------

def sglang_yarn_cos_sin(rope_scaling: dict, rope_theta: float, head_dim: int, positions: torch.Tensor):
    """SGLang's YaRNScalingRotaryEmbedding (rotary/yarn), as get_rope builds it from a Llama/Qwen3
    drafter's rope_scaling: only extrapolation_factor, attn_factor, beta_fast and beta_slow are read."""
    factor = rope_scaling["factor"]
    orig = rope_scaling["original_max_position_embeddings"]
    attn_factor = rope_scaling.get("attn_factor", 1.0)
    beta_fast, beta_slow = rope_scaling.get("beta_fast", 32), rope_scaling.get("beta_slow", 1)

    def correction_dim(rot):
        return (head_dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(rope_theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    mask = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - mask) + (1.0 / pos_freqs) * mask
    mscale = (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0) * attn_factor
    freqs = positions.float()[:, None] * inv_freq[None]
    freqs = torch.cat([freqs, freqs], dim=-1)  # neox style: both halves of a head rotate by the same angles
    return freqs.cos() * mscale, freqs.sin() * mscale


DEEPSEEK_V3_ROPE = {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                    "beta_slow": 1.0, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}


@pytest.mark.parametrize("rope", [DEEPSEEK_V3_ROPE,
                                  {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                   "rope_theta": 1000000.0}],
                         ids=["deepseek-v3-factor40", "qwen3-factor4"])
@pytest.mark.parametrize("export", [eagle3_config_json, dflash_config_json])
def test_served_yarn_cos_sin_equal_the_trained_ones(rope, export):
    head_dim, positions = 128, torch.tensor([0, 1, 17, 1000, 5000, 90000])
    common = dict(hidden_size=7168, intermediate_size=64, num_attention_heads=56, num_key_value_heads=8,
                  head_dim=head_dim, vocab_size=100, target_hidden_size=7168, target_num_layers=61,
                  max_position_embeddings=163840, rope=dict(rope))
    cfg = Eagle3Config(**common, draft_vocab_size=50, aux_layer_ids=[1, 29, 57]) if export is eagle3_config_json \
        else DFlashConfig(**common, target_layer_ids=[1, 29, 57], mask_token_id=3)
    served = export(cfg, "bfloat16")
    cos_s, sin_s = sglang_yarn_cos_sin(served["rope_scaling"], served["rope_theta"], head_dim, positions)
    rotary = Rotary(7168, 56, head_dim, 163840, rope)
    cos_t, sin_t = rotary(torch.zeros(1, len(positions), 8), positions[None])
    torch.testing.assert_close(cos_s, cos_t[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(sin_s, sin_t[0], atol=2e-5, rtol=1e-4)


def test_deepseek_trained_yarn_scale_is_one_and_sglangs_would_be_1_37():
    rotary = Rotary(7168, 56, 128, 163840, DEEPSEEK_V3_ROPE)
    assert rotary.inner.attention_scaling == pytest.approx(1.0)
    assert yarn_mscale(40.0) == pytest.approx(1.3689, abs=1e-4)  # what an export without attn_factor serves


# ---- attention shape of an MLA target's drafter --------------------------------------------------

def test_deepseek_v3_drafter_is_56_heads_of_128_with_8_kv_heads():
    from transformers import DeepseekV3Config

    target = DeepseekV3Config(hidden_size=7168, intermediate_size=18432, num_attention_heads=128,
                              num_key_value_heads=128, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                              qk_nope_head_dim=128, v_head_dim=128, num_hidden_layers=61, vocab_size=129280)
    assert target.head_dim == 64  # transformers' own, the qk_rope_head_dim: not what the drafter should copy
    s = sized_like(target)
    assert (s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]) == (56, 8, 128)


def test_llama_drafter_copies_the_targets_attention_shape():
    from transformers import LlamaConfig

    s = sized_like(LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8))
    assert (s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]) == (32, 8, 128)

"""Capture hooks find the decoder layers of other architectures: Qwen3, Qwen3-MoE, DeepSeek-V3 (MLA + MoE)."""

from __future__ import annotations

import json

import pytest
import torch

from ops.errors import UserError
from trainer.hidden_states import capture, extract
from trainer.hidden_states import cli as hs_cli
from trainer.hidden_states.capture import TargetHiddenStates
from trainer.hidden_states.dataset import HiddenStateDataset


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=96,
                                        max_position_embeddings=64))


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                              num_experts=4, num_experts_per_tok=2, num_hidden_layers=8,
                                              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                              vocab_size=96, max_position_embeddings=64))


def _deepseek_v3():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM(DeepseekV3Config(
        hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=8, first_k_dense_replace=2,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, vocab_size=96, max_position_embeddings=64))


BUILDERS = {"qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "deepseek_v3": _deepseek_v3}


@pytest.fixture(scope="module", params=list(BUILDERS))
def model(request):
    torch.manual_seed(0)
    return BUILDERS[request.param]().eval()


def test_aux_states_match_output_hidden_states(model):
    target = TargetHiddenStates(model, [1, 3, 5])
    assert target.num_layers == 8 and target.hidden_size == 32
    ids = torch.randint(0, 96, (2, 11))
    mask = torch.ones_like(ids)
    aux, last, logits = target(ids, mask, return_logits=True)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    want = torch.cat([out.hidden_states[i + 1] for i in (1, 3, 5)], dim=-1)
    torch.testing.assert_close(aux, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, out.hidden_states[-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)


def test_extract_to_dir_from_a_saved_moe_mla_target(tmp_path, model):
    model.save_pretrained(tmp_path / "target")
    rows = [{"id": f"s{i}", "input_ids": list(range(3 + i, 12 + 2 * i)), "loss_mask": [1] * (9 + i)} for i in range(3)]
    (tmp_path / "tok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = extract.extract_to_dir(tmp_path / "target", tmp_path / "tok.jsonl", tmp_path / "hs", dtype="float32",
                             device="cpu", log=lambda m: None)
    assert meta["aux_layers"] == [1, 3, 4] and meta["num_layers"] == 8
    ds = HiddenStateDataset(tmp_path / "hs")
    with torch.no_grad():
        out = model(torch.tensor([rows[2]["input_ids"]]), output_hidden_states=True, use_cache=False)
    want = torch.cat([out.hidden_states[i + 1][0] for i in (1, 3, 4)], dim=-1)
    torch.testing.assert_close(ds[2]["aux"], want, atol=1e-5, rtol=1e-5)


def test_no_layer_list_is_one_clear_error():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"num_hidden_layers": 3, "get_text_config": lambda self: self})()
            self.model = torch.nn.Sequential(torch.nn.Linear(2, 2))

    with pytest.raises(UserError, match="cannot find its 3 decoder layers"):
        capture.decoder_layers(Odd())


def test_device_map_auto_and_trust_remote_code_reach_the_loader(tmp_path):
    """`--device-map auto` (accelerate places the layers; all on the CPU here) captures the same data."""
    from tests.support.tiny import tiny_target_dir

    rows = [{"id": f"s{i}", "input_ids": list(range(5, 14 + i)), "loss_mask": [1] * (9 + i)} for i in range(3)]
    (tmp_path / "tok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"), "--dtype", "float32"]
    assert hs_cli.main([*base, "--out", str(tmp_path / "plain"), "--device", "cpu"]) == 0
    assert hs_cli.main([*base, "--out", str(tmp_path / "mapped"), "--device-map", "auto", "--trust-remote-code"]) == 0
    a, b = HiddenStateDataset(tmp_path / "plain"), HiddenStateDataset(tmp_path / "mapped")
    for i in range(3):
        torch.testing.assert_close(a[i]["aux"], b[i]["aux"], atol=1e-6, rtol=1e-6)

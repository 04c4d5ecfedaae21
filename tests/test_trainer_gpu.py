"""What only a CUDA GPU can show (marker `gpu`; skipped elsewhere): bf16 training of both drafters, a NaN
step skipped on the device, DFlash's masked SDPA backward finite in bf16 on the pinned backend, the
target loaded straight onto the GPU. `make gpu-check` runs these with the python3 already on a GPU
machine; they import nothing beyond torch, transformers, safetensors and tokenizers (no conftest)."""

from __future__ import annotations

import json
import random

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.hidden_states.extract import extract_to_dir
    from trainer.vocab import write_draft_vocab

    root = tmp_path_factory.mktemp("gpu")
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(root / "target")
    rng = random.Random(0)
    with (root / "data.jsonl").open("w") as f:
        for i in range(32):
            n = rng.randint(64, 256)
            f.write(json.dumps({"id": f"s{i}", "input_ids": [rng.randrange(512) for _ in range(n)],
                                "loss_mask": [0] * 8 + [1] * (n - 8)}) + "\n")
    write_draft_vocab(root / "data.jsonl", root / "vocab.safetensors", target_vocab_size=512, draft_vocab_size=256)
    extract_to_dir(root / "target", root / "data.jsonl", root / "hs", dtype="bfloat16", device="cuda",
                   log=lambda m: None)
    return root


def _args(root, out, mode, *extra):
    vocab = ["--vocab", str(root / "vocab.safetensors")] if mode == "eagle3" \
        else ["--block-size", "16", "--mask-token-id", "3", "--num-anchors", "32"]
    return ["--mode", mode, "--target", str(root / "target"), *vocab, "--hidden-states", str(root / "hs"),
            "--out", str(out), "--batch-size", "4", "--lr", "3e-3", "--num-workers", "0", "--device", "cuda",
            "--dtype", "bfloat16", "--max-steps", "16", "--log-every", "4", *extra]


@pytest.mark.parametrize("mode", ["eagle3", "dflash"])
def test_bf16_training_on_cuda_learns_and_exports_finite_weights(data, tmp_path, mode):
    from safetensors.torch import load_file

    from trainer.train import run

    done = run(_args(data, tmp_path / mode, mode), log=lambda m: None)
    recs = [json.loads(x) for x in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
    assert done["status"] == "completed" and recs[-1]["nonfinite_steps"] == 0
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]
    weights = load_file(str(tmp_path / mode / "final" / "model.safetensors"))
    assert all(torch.isfinite(v.float()).all() for v in weights.values() if v.is_floating_point())


def test_a_nan_step_on_cuda_is_skipped_and_never_reaches_the_weights(data, tmp_path, monkeypatch):
    from trainer.train import Trainer, run

    original = Trainer._loss

    def poisoned(self, batch):
        loss, stats = original(self, batch)
        return (loss * float("nan") if self.step in (3, 4) else loss), stats

    monkeypatch.setattr(Trainer, "_loss", poisoned)
    run(_args(data, tmp_path / "nan", "eagle3"), log=lambda m: None)
    recs = [json.loads(x) for x in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["nonfinite_steps"] == 2
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "nan" / "final" / "model.safetensors"))
    assert all(torch.isfinite(v.float()).all() for v in weights.values() if v.is_floating_point())


def test_dflash_masked_sdpa_backward_is_finite_in_bf16_on_the_pinned_backend():
    from trainer.models.dflash import DFlashConfig, DFlashDrafter, build_blocks

    torch.manual_seed(0)
    cfg = DFlashConfig(hidden_size=1024, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=128, vocab_size=1024, target_hidden_size=1024, target_num_layers=8,
                       target_layer_ids=[1, 3, 5], mask_token_id=3, num_hidden_layers=2, block_size=16)
    model = DFlashDrafter(cfg).cuda()
    b, t = 2, 1024
    ids = torch.randint(0, 1024, (b, t), device="cuda")
    lm = torch.ones(b, t, dtype=torch.long, device="cuda")
    blocks = build_blocks(ids, lm, [t, t - 100], block_size=16, num_anchors=64, mask_token_id=3,
                          generator=torch.Generator().manual_seed(0))
    feats = torch.randn(b, t, 3 * 1024, device="cuda")
    ctx_pos = torch.arange(t, device="cuda")[None].expand(b, t)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(feats, blocks["block_ids"], ctx_pos, blocks["block_positions"], blocks["layout"],
                       blocks["label_valid"].flatten(1))
        loss = torch.nn.functional.cross_entropy(logits.float(), blocks["labels"][blocks["label_valid"]])
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)


def test_the_target_loads_straight_onto_the_gpu_and_matches_the_cpu(data):
    from trainer.hidden_states.capture import TargetHiddenStates

    ids = torch.randint(0, 512, (2, 64))
    gpu = TargetHiddenStates(data / "target", [0, 1, 2], dtype=torch.float32, device="cuda")
    assert all(p.device.type == "cuda" for p in gpu.model.parameters())
    cpu = TargetHiddenStates(data / "target", [0, 1, 2], dtype=torch.float32, device="cpu")
    a, _, _ = gpu(ids.cuda())
    b, _, _ = cpu(ids)
    torch.testing.assert_close(a.cpu(), b, atol=2e-3, rtol=2e-3)

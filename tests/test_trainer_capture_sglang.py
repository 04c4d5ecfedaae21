"""`--backend sglang`: refused in one line where it cannot run; on a GPU node with sglang and
specforge installed, the captured states match the transformers backend's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.tiny import tiny_target_dir
from tests.test_trainer_hidden_states import write_tokenized
from trainer.hidden_states import capture, dataset, extract
from trainer.hidden_states import cli as hs_cli

REPO = Path(__file__).resolve().parents[1]
MISSING = [m for m in ("sglang", "specforge") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(not MISSING and torch.cuda.is_available(), reason="sglang, specforge and a GPU are all here")
def test_refused_in_one_line_before_any_work(tmp_path, capsys):
    write_tokenized(tmp_path / "tok.jsonl", 2)
    rc = hs_cli.main(["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                  "--out", str(tmp_path / "hs"), "--backend", "sglang"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("nodedeck-train: --backend sglang needs")
    assert not (tmp_path / "hs").exists()


@pytest.mark.skipif(bool(MISSING) or not torch.cuda.is_available(),
                    reason=f"runs only on a CUDA GPU with sglang and specforge installed; here: "
                           f"{', '.join(MISSING) or 'nothing'} missing, CUDA {torch.cuda.is_available()}")
def test_sglang_capture_matches_transformers(tmp_path):
    write_tokenized(tmp_path / "tok.jsonl", 6, seed=9)
    extract.extract_to_dir(tiny_target_dir(), tmp_path / "tok.jsonl", tmp_path / "hf", dtype="bfloat16", device="cuda",
                      log=lambda m: None)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "hidden-states", "--backend", "sglang",
                           "--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                           "--out", str(tmp_path / "sg"), "--dtype", "bfloat16"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = dataset.HiddenStateDataset(tmp_path / "hf"), dataset.HiddenStateDataset(tmp_path / "sg")
    assert json.loads((tmp_path / "sg" / "index.json").read_text())["aux_layers"] == a.meta["aux_layers"]
    for i in range(len(a)):
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"])
        torch.testing.assert_close(b[i]["aux"].float(), a[i]["aux"].float(), atol=5e-2, rtol=5e-2)
        torch.testing.assert_close(b[i]["last"].float(), a[i]["last"].float(), atol=5e-2, rtol=5e-2)


# ---- what needs no GPU: refusals, the engine's settings, batching (a stand-in engine) -------------

def test_tensor_parallel_that_does_not_divide_the_heads_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "7")  # torchrun over the 7 GPUs a plan left for this stage
    write_tokenized(tmp_path / "tok.jsonl", 2)
    rc = hs_cli.main(["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                  "--out", str(tmp_path / "hs"), "--backend", "sglang"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "tensor parallel 7" in err[0] and "does not divide the target's 4 attention heads" in err[0]
    assert "run 1, 2, 4, 8 ranks" in err[0] or "run 1, 2, 4 ranks" in err[0]
    assert not (tmp_path / "hs").exists()


class FakeCapture:
    """Stands in for SpecForge's SGLang capture: records what it is given and returns the tiny target's
    real states (computed by the transformers backend), so the shards can be compared."""

    made: list = []

    def __init__(self, model_dir, kwargs):
        self.kwargs, self.layers, self.batches = kwargs, None, []
        self.model_dir = model_dir
        FakeCapture.made.append(self)

    def set_capture_layers(self, ids, *, capture_method):
        self.layers = (list(ids), capture_method)

    def capture(self, *, input_ids, attention_mask, loss_mask):
        import types

        self.batches.append(tuple(input_ids.shape))
        target = capture.TargetHiddenStates(self.model_dir, self.aux, dtype=torch.float32, device="cpu")
        aux, last, _ = target(input_ids, attention_mask)
        return types.SimpleNamespace(hidden_states=aux, last_hidden_states=last)


@pytest.fixture
def fake_engine(monkeypatch):
    from trainer import capture_sglang

    FakeCapture.made = []
    monkeypatch.setattr(capture_sglang, "require", lambda: None)
    monkeypatch.setattr(capture_sglang, "_init_tensor_parallel", lambda tp: None)
    monkeypatch.setattr(capture_sglang, "_load_capture", lambda model_dir, **kw: FakeCapture(model_dir, kw))
    return FakeCapture


def test_memory_settings_and_token_budget_reach_the_engine(tmp_path, fake_engine, monkeypatch):
    monkeypatch.setattr(FakeCapture, "aux", [0, 1, 2], raising=False)
    rows = write_tokenized(tmp_path / "tok.jsonl", 12, seed=3)
    longest = max(len(r["input_ids"]) for r in rows)
    extract.extract_to_dir(tiny_target_dir(), tmp_path / "tok.jsonl", tmp_path / "sg", backend="sglang",
                      aux_layers=[0, 1, 2], batch_size=8, batch_tokens=64, mem_fraction_static=0.7,
                      dtype="float32", log=lambda m: None)
    (engine,) = fake_engine.made
    kw = engine.kwargs
    assert kw["mem_fraction_static"] == 0.7 and kw["max_running_requests"] == 8
    assert kw["context_length"] > longest and kw["max_total_tokens"] >= max(64, longest)
    assert engine.layers == ([0, 1, 2], "eagle3")
    assert all(rows * width <= max(64, width) and rows <= 8 for rows, width in engine.batches)
    assert sum(r for r, _ in engine.batches) == 12
    # the shards hold exactly what the transformers backend writes
    extract.extract_to_dir(tiny_target_dir(), tmp_path / "tok.jsonl", tmp_path / "hf", aux_layers=[0, 1, 2],
                      dtype="float32", device="cpu", log=lambda m: None)
    a, b = dataset.HiddenStateDataset(tmp_path / "hf"), dataset.HiddenStateDataset(tmp_path / "sg")
    for i in range(len(a)):
        torch.testing.assert_close(b[i]["aux"], a[i]["aux"])
        torch.testing.assert_close(b[i]["last"], a[i]["last"])


def test_deepseek_layer_ids_are_handed_to_sglang_by_its_rule(tmp_path, fake_engine, monkeypatch):
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=8,
                           num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32,
                           qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, vocab_size=700,
                           n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    cfg.save_pretrained(tmp_path / "ds")
    write_tokenized(tmp_path / "tok.jsonl", 2)

    def capture(self, *, input_ids, attention_mask, loss_mask):
        import types

        b, t = input_ids.shape
        return types.SimpleNamespace(hidden_states=torch.zeros(b, t, 3 * 64), last_hidden_states=torch.zeros(b, t, 64))

    monkeypatch.setattr(FakeCapture, "capture", capture)
    extract.extract_to_dir(tmp_path / "ds", tmp_path / "tok.jsonl", tmp_path / "out", backend="sglang",
                      aux_layers=[2, 4, 5], dtype="float32", log=lambda m: None)
    assert fake_engine.made[0].layers == ([3, 5, 6], "eagle3")  # DeepSeek takes ids not starting at 1 as is
    assert json.loads((tmp_path / "out" / "index.json").read_text())["aux_layers"] == [2, 4, 5]


# ---- several nodes, no shared disk ---------------------------------------------------------------

def _capture_rank(rank: int, world: int, port: int, args: list[str], outs: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK="0")  # one rank per "node"
    torch.set_num_threads(1)
    rc = hs_cli.main([*args, "--out", outs[rank]])
    Path(outs[rank], f"rc-{rank}").write_text(str(rc))


def test_two_nodes_without_a_shared_disk_each_get_the_whole_index(tmp_path):
    import torch.multiprocessing as mp

    from tests.support.spawned import join_within
    from tests.support.sshd import free_port

    write_tokenized(tmp_path / "tok.jsonl", 10, seed=5)
    outs = [str(tmp_path / "node-a" / "hs"), str(tmp_path / "node-b" / "hs")]
    args = ["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"), "--shard-samples", "3",
            "--device", "cpu", "--dtype", "float32"]
    ctx = mp.spawn(_capture_rank, args=(2, free_port(), args, outs), nprocs=2, join=False)
    join_within(ctx, 240)
    assert [Path(o, f"rc-{r}").read_text() for r, o in enumerate(outs)] == ["0", "0"]
    a, b = (json.loads(Path(o, "index.json").read_text()) for o in outs)
    assert a == b and [s["file"] for s in a["shards"]] == [f"shard-{n:05d}.safetensors" for n in range(4)]
    assert sorted(p.name for p in Path(outs[0]).glob("shard-*")) == ["shard-00000.safetensors",
                                                                      "shard-00002.safetensors"]
    assert a["num_samples"] == 10

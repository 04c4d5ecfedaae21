"""A NaN loss or gradient never reaches the weights: the step is skipped on every rank, counted in the
metrics, training stops after too many in a row, and NaN weights are never checkpointed or exported."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from ops.errors import NodedeckError, UserError
from tests.support.spawned import join_within
from tests.support.sshd import free_port
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from trainer.checkpoint import NonFiniteWeights
from trainer.train import NonFinite, Trainer, run


def _poison(steps: set[int], ranks: set[int] | None = None):
    """Patch Trainer._loss so the loss of the given 0-based steps (on the given ranks) is NaN."""
    original = Trainer._loss

    def poisoned(self, batch):
        loss, stats = original(self, batch)
        if self.step in steps and (ranks is None or self.info.rank in ranks):
            loss = loss * float("nan")
        return loss, stats
    return poisoned


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from trainer.hidden_states.extract import extract_to_dir
    from trainer.vocab import write_draft_vocab

    root = tmp_path_factory.mktemp("nonfinite")
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(root / "target")
    rng = random.Random(0)
    with (root / "data.jsonl").open("w") as f:
        for i in range(16):
            ids = [rng.randrange(96) for _ in range(rng.randint(8, 24))]
            f.write(json.dumps({"id": f"s{i}", "input_ids": ids, "loss_mask": [0, 0] + [1] * (len(ids) - 2)}) + "\n")
    write_draft_vocab(root / "data.jsonl", root / "vocab.safetensors", target_vocab_size=96, draft_vocab_size=48)
    extract_to_dir(root / "target", root / "data.jsonl", root / "hs", dtype="float32", device="cpu",
                   log=lambda m: None)
    return root


def _args(root, out, mode="eagle3", *extra):
    vocab = ["--vocab", str(root / "vocab.safetensors")] if mode == "eagle3" \
        else ["--block-size", "4", "--mask-token-id", "3"]
    return ["--mode", mode, "--target", str(root / "target"), *vocab, "--hidden-states", str(root / "hs"),
            "--out", str(out), "--batch-size", "2", "--lr", "1e-2", "--ttt-length", "3", "--num-workers", "0",
            "--max-steps", "6", *extra]


@pytest.mark.parametrize("mode", ["eagle3", "dflash"])
def test_nan_steps_are_skipped_counted_and_never_reach_the_weights(data, tmp_path, monkeypatch, mode):
    monkeypatch.setattr(Trainer, "_loss", _poison({1, 2}))
    logs: list[str] = []
    done = run(_args(data, tmp_path / "out", mode), log=logs.append)
    recs = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["nonfinite_steps"] for r in recs] == [0, 1, 2, 2, 2, 2]
    assert "loss" not in recs[1] and "loss" not in recs[2]  # a skipped step has no loss to average
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in recs if "loss" in r)
    assert done["status"] == "completed" and done["steps"] == 6
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "out" / "final" / "model.safetensors"))
    assert all(torch.isfinite(v.float()).all() for v in weights.values() if v.is_floating_point())
    assert sum("non-finite" in m for m in logs) == 2


def test_too_many_nonfinite_steps_in_a_row_stop_without_saving(data, tmp_path, monkeypatch):
    monkeypatch.setattr(Trainer, "_loss", _poison({2, 3, 4, 5}))
    with pytest.raises(NonFinite, match="3 steps in a row"):
        run(_args(data, tmp_path / "out", "eagle3", "--max-nonfinite-steps", "3"), log=lambda m: None)
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "final").exists()
    assert not (tmp_path / "out" / "done.json").exists()


def test_nan_weights_are_never_checkpointed_or_exported(data, tmp_path):
    from trainer.distributed import DistInfo, unwrap
    from trainer.export import export_drafter
    from trainer.train import build_parser
    from trainer.train_config import TrainConfig

    cfg = TrainConfig.from_args(build_parser().parse_args(_args(data, tmp_path / "out")))
    trainer = Trainer(cfg, DistInfo(), log=lambda m: None)
    with torch.no_grad():
        unwrap(trainer.model).fc.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights, match="fc.weight"):
        trainer.save()
    assert not list((tmp_path / "out").glob("checkpoints/step-*"))
    with pytest.raises(UserError, match="fc.weight"):
        export_drafter(unwrap(trainer.model), tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_max_nonfinite_steps_must_be_positive(data, tmp_path):
    with pytest.raises(UserError, match="--max-nonfinite-steps"):
        run(_args(data, tmp_path / "out", "eagle3", "--max-nonfinite-steps", "0"), log=lambda m: None)


def _worker(rank: int, world: int, port: int, args: list[str], root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from trainer.distributed import unwrap

    Trainer._loss = _poison({1}, ranks={1})  # NaN on rank 1 only: rank 0's own loss is finite
    seen = {}

    def on_step(trainer, _batch, loss):
        seen[trainer.step] = {"loss": loss, "skipped": trainer.nonfinite_total,
                              "fc": unwrap(trainer.model).fc.weight.detach().clone()}

    try:
        run(args, on_step=on_step, log=lambda m: None)
        torch.save(seen, os.path.join(root, f"rank{rank}.pt"))
    except NodedeckError as exc:
        torch.save({"error": str(exc)}, os.path.join(root, f"rank{rank}.pt"))


def test_ranks_agree_to_skip_a_step_that_is_nan_on_one_rank(data, tmp_path):
    args = _args(data, tmp_path / "out", "eagle3", "--max-steps", "3")
    ctx = mp.spawn(_worker, args=(2, free_port(), args, str(tmp_path)), nprocs=2, join=False)
    join_within(ctx, 420)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert "error" not in r0 and "error" not in r1
    assert torch.isfinite(torch.tensor(r0[2]["loss"])) and not torch.isfinite(torch.tensor(r1[2]["loss"]))
    assert r0[2]["skipped"] == r1[2]["skipped"] == 1  # rank 0 skipped too, though its loss was finite
    assert torch.equal(r0[1]["fc"], r0[2]["fc"])      # ... and did not move its weights at that step
    for step in (1, 2, 3):
        assert torch.equal(r0[step]["fc"], r1[step]["fc"]) and torch.isfinite(r0[step]["fc"]).all()
    assert not torch.equal(r0[2]["fc"], r0[3]["fc"])  # the next step trains again


def test_resume_sets_the_rng_of_only_the_gpus_it_sees(monkeypatch):
    """Saved with 8 visible GPUs, resumed with 1: the states of GPUs that are not there are left out."""
    from trainer import checkpoint

    calls = []

    def set_state(state, device=0):
        index = torch.device("cuda", device).index if not isinstance(device, int) else device
        if index >= torch.cuda.device_count():
            raise RuntimeError(f"invalid device ordinal {index}")
        calls.append(index)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_state)
    gen = {"cpu": torch.Generator()}
    state = {"python": __import__("random").getstate(), "numpy": __import__("numpy").random.get_state(),
             "torch": torch.get_rng_state(), "generators": {"cpu": gen["cpu"].get_state()},
             "cuda": [torch.ByteTensor(16)] * 8}
    checkpoint.set_rng_state(state, gen)
    assert calls == [0]
